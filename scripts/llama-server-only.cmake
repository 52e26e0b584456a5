# Passed to llama.cpp's configure step as -DCMAKE_PROJECT_INCLUDE by ./scripts/test-real, so
# that `cmake --build` (which always builds `all`) compiles llama-server and what it links
# against, and nothing else: the real-backend target needs no other tool, and on two cores the
# rest costs more than half of the build.
get_property(_server_only_armed GLOBAL PROPERTY LLAMA_SERVER_ONLY_ARMED)
if(NOT _server_only_armed)
  set_property(GLOBAL PROPERTY LLAMA_SERVER_ONLY_ARMED TRUE)

  function(_server_only_collect dir out)
    get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
    get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
    foreach(sub IN LISTS subdirs)
      _server_only_collect("${sub}" more)
      list(APPEND targets ${more})
    endforeach()
    set(${out} ${targets} PARENT_SCOPE)
  endfunction()

  function(_server_only_apply)
    _server_only_collect("${CMAKE_SOURCE_DIR}" targets)
    if(NOT "llama-server" IN_LIST targets)
      message(FATAL_ERROR "llama-server-only.cmake: no llama-server target (LLAMA_BUILD_TOOLS off?)")
    endif()
    set(kept 0)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(target STREQUAL "llama-server" OR type STREQUAL "INTERFACE_LIBRARY")
        continue()
      endif()
      # A target llama-server depends on is still built: EXCLUDE_FROM_ALL only drops it from
      # `all`, not from its dependants.
      set_target_properties(${target} PROPERTIES EXCLUDE_FROM_ALL TRUE)
    endforeach()
    message(STATUS "llama-server-only.cmake: `all` builds llama-server and its dependencies")
  endfunction()

  # Deferred to the end of the top-level directory, when every target exists.
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _server_only_apply)
endif()
