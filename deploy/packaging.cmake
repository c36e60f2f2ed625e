# Debian packages, one per component; `cpack -G DEB` in the build directory (or `ninja package`) writes
#
#   ddl-coordinator  /usr/bin/ddl-coordinator, /lib/systemd/system/ddl-coordinator.service,
#                    /etc/ddl/coordinator.json (conffile), /usr/share/doc/ddl-coordinator/{operations,security}.md
#   ddl-agent        /usr/bin/ddl-agent, /lib/systemd/system/ddl-agent.service,
#                    /etc/ddl/agent.json (conffile), /usr/share/doc/ddl-agent/{operations,security}.md
#   ddlctl           /usr/bin/ddlctl
#   libddl           /usr/lib/libddl.so*, /usr/include/ddl/ddl.h, /usr/bin/ddlrun, /usr/bin/ddl-bench,
#                    /usr/bin/ddl-sim (where nlohmann/json is found), /usr/lib/pkgconfig/ddl.pc and /usr/lib/cmake/ddl/ (find_package(ddl): ddl::ddl)
#   python3-torch-ddl  /usr/lib/python3/dist-packages/torch_ddl (the torch.distributed backend "ddl"), where
#                    torch_ddl was built (python/CMakeLists.txt)
#
# Runtime dependencies come from dpkg-shlibdeps; the architecture from dpkg (the target's when cross-compiling),
# so the same rules package amd64, arm64 and ppc64el. The daemons' packages neither enable nor start their units:
# the configs need editing first (docs/operations.md). Included from the top-level CMakeLists.txt once every
# target exists; the binaries' own install() rules live next to them and name these components. A libddl-only
# build (DDL_BUILD_SERVICE=OFF) packages libddl alone.

set(CPACK_COMPONENTS_ALL libddl)
if(TARGET ddl-coordinator AND TARGET ddl-agent AND TARGET ddlctl)
  list(APPEND CPACK_COMPONENTS_ALL coordinator agent ddlctl)

  # The unit and config directories are absolute (packages put them at /lib/systemd/system and /etc whatever
  # the prefix); override them for a `cmake --install` into a scratch tree.
  set(DDL_SYSTEMD_UNIT_DIR /lib/systemd/system CACHE PATH "where install puts the systemd units")
  set(DDL_SYSCONF_DIR /etc CACHE PATH "where install puts ddl/coordinator.json and ddl/agent.json")

  # ddl-ranks.service: the delegated cgroup the agent confines ranks under (see the unit's comment).
  install(FILES ${CMAKE_CURRENT_LIST_DIR}/systemd/ddl-ranks.service DESTINATION ${DDL_SYSTEMD_UNIT_DIR}
          COMPONENT agent)
  foreach(daemon coordinator agent)
    install(FILES ${CMAKE_CURRENT_LIST_DIR}/systemd/ddl-${daemon}.service DESTINATION ${DDL_SYSTEMD_UNIT_DIR}
            COMPONENT ${daemon})
    install(FILES ${CMAKE_CURRENT_LIST_DIR}/etc/ddl/${daemon}.json DESTINATION ${DDL_SYSCONF_DIR}/ddl
            COMPONENT ${daemon})
    install(FILES ${PROJECT_SOURCE_DIR}/docs/operations.md ${PROJECT_SOURCE_DIR}/docs/security.md
            DESTINATION share/doc/ddl-${daemon} COMPONENT ${daemon})
  endforeach()

  # Maintainer scripts and conffiles of the two daemon packages, from the templates in deploy/debian/.
  # on_upgrade is what postinst does to a running daemon when its package is upgraded: the coordinator restarts
  # without losing anything (agents keep the ranks and report them again); the agent would take its node's ranks
  # down with it, so that is left to the operator until it keeps them (keep_ranks_on_exit, re-adoption).
  function(ddl_deb_control daemon on_upgrade)
    set(PACKAGE ddl-${daemon})
    set(UNIT ddl-${daemon}.service)
    set(ON_UPGRADE "${on_upgrade}")
    set(dir ${CMAKE_BINARY_DIR}/deploy/debian/${PACKAGE})
    file(CONFIGURE OUTPUT ${dir}/conffiles CONTENT "${DDL_SYSCONF_DIR}/ddl/${daemon}.json\n")
    set(extra ${dir}/conffiles)
    foreach(script postinst prerm postrm)
      configure_file(${CMAKE_CURRENT_FUNCTION_LIST_DIR}/debian/${script}.in ${dir}/${script} @ONLY
                     FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
                     WORLD_EXECUTE)
      list(APPEND extra ${dir}/${script})
    endforeach()
    string(TOUPPER ${daemon} c)
    set(CPACK_DEBIAN_${c}_PACKAGE_CONTROL_EXTRA ${extra} PARENT_SCOPE)
  endfunction()
  ddl_deb_control(coordinator "systemctl try-restart ddl-coordinator.service >/dev/null || true")
  ddl_deb_control(agent "echo 'ddl-agent: upgraded; the old agent runs until \"systemctl restart ddl-agent\", \
which today also stops the ranks on this node (drain it first: ddlctl drain NODE)'")
endif()

if(TARGET torch_ddl_ext)
  list(APPEND CPACK_COMPONENTS_ALL torch)
  set(CPACK_DEBIAN_TORCH_PACKAGE_NAME python3-torch-ddl)
  set(CPACK_DEBIAN_TORCH_PACKAGE_SECTION python)
  # The extension is built against torch 1.13's C++ ABI: any other torch needs a rebuild.
  set(CPACK_DEBIAN_TORCH_PACKAGE_DEPENDS "python3-torch (>= 1.13), python3-torch (<< 1.14), libddl (= ${PROJECT_VERSION})")
  # dpkg-shlibdeps finds libddl.so.0 in the build tree (it is not installed here); the dependency on the
  # libddl package is the one above.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_LIBRARY_OUTPUT_DIRECTORY})
  set(CPACK_DEBIAN_TORCH_DESCRIPTION "torch.distributed backend ddl over libddl
Importing torch_ddl registers the backend: init_process_group with backend ddl then runs
PyTorch's collectives, DistributedDataParallel included, over libddl (UCX: InfiniBand,
shared memory, TCP).")
endif()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddl)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(DDL_PACKAGE_MAINTAINER "ddl maintainers <root@localhost>" CACHE STRING "Maintainer field of the .deb packages")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DDL_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# shlibs for libddl.so.0 (the one package with a shared library), so packages built on it depend on libddl.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
# The Debian architecture of the binaries: the host's, or the target's multiarch triplet when cross-compiling.
find_program(DDL_DPKG_ARCHITECTURE dpkg-architecture)
find_program(DDL_DPKG dpkg)
if(CMAKE_CROSSCOMPILING AND CMAKE_LIBRARY_ARCHITECTURE AND DDL_DPKG_ARCHITECTURE)
  execute_process(COMMAND ${DDL_DPKG_ARCHITECTURE} -t${CMAKE_LIBRARY_ARCHITECTURE} -qDEB_HOST_ARCH
                  OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
elseif(DDL_DPKG)
  execute_process(COMMAND ${DDL_DPKG} --print-architecture OUTPUT_VARIABLE CPACK_DEBIAN_PACKAGE_ARCHITECTURE
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()

set(CPACK_DEBIAN_COORDINATOR_PACKAGE_NAME ddl-coordinator)
set(CPACK_DEBIAN_COORDINATOR_PACKAGE_SECTION net)
set(CPACK_DEBIAN_COORDINATOR_DESCRIPTION "ddl cluster coordinator
Places gang-scheduled distributed training jobs on GPU nodes and keeps their state
in SQLite. Runs as the systemd unit ddl-coordinator.service.")
set(CPACK_DEBIAN_AGENT_PACKAGE_NAME ddl-agent)
set(CPACK_DEBIAN_AGENT_PACKAGE_SECTION net)
set(CPACK_DEBIAN_AGENT_DESCRIPTION "ddl node agent
Registers a GPU node with ddl-coordinator and runs the ranks of the jobs placed on it.
Runs as the systemd unit ddl-agent.service.")
set(CPACK_DEBIAN_DDLCTL_PACKAGE_NAME ddlctl)
set(CPACK_DEBIAN_DDLCTL_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_DDLCTL_DESCRIPTION "ddl command-line client
Submits, lists, inspects and cancels jobs and drains nodes through ddl-coordinator.")
set(CPACK_DEBIAN_LIBDDL_PACKAGE_NAME libddl)
set(CPACK_DEBIAN_LIBDDL_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_LIBDDL_DESCRIPTION "ddl collective library (libddl), its header and tools
NCCL-shaped allreduce, reduce, broadcast, gathers, scatters, all-to-all, barrier and
point-to-point over UCX: libddl.so, ddl/ddl.h, ddl.pc for pkg-config, the CMake
package ddl (find_package(ddl), target ddl::ddl), the launcher ddlrun and the
benchmark ddl-bench.")

include(CPack)
