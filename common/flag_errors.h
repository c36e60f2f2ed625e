// Command-line mistakes said for a person, for every program of ddl that parses flags with CLI11 (ddlctl,
// ddl-agent, ddl-coordinator): the unknown flag and the nearest real one ("did you mean"), a value that is
// not a number, a missing value; CLI11's own text only where nothing better is known.
//
// Threads: pure functions.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <string>
#include <vector>

namespace ddl {

// Edit distance with a swap of neighbours counted as one (Damerau).
size_t editDistance(const std::string& a, const std::string& b);

// The candidate nearest to `given`: within 2 edits (1 for words of up to 4 letters), or one that starts with
// it ("--gpus-per" for --gpus-per-node; a closer spelling goes first); "" if none.
std::string nearestWord(const std::string& given, const std::vector<std::string>& candidates);

// Every long flag ("--gpus") of `scope` and of the apps above it.
std::vector<std::string> longFlagNames(const CLI::App& scope);

// The innermost subcommand `app`'s words reached, or `app` itself.
const CLI::App& innermostSubcommand(const CLI::App& app);

// `e` (from app.parse) said for a person: "unknown option --nmae; did you mean --name?", "--port takes a
// number, got 'x'", or CLI11's own words.
std::string describeFlagError(const CLI::App& app, const CLI::ParseError& e);

// Parses a daemon's command line: -1 to go on; 0 after --help or --version (printed); 2 after a mistake,
// printed on stderr as "PROGRAM: what was wrong" with the pointer to --help.
int parseFlags(CLI::App& app, int argc, char** argv);

}  // namespace ddl
