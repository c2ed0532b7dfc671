# Finds mysql-connector-c++ 1.1 (Debian: libmysqlcppconn-dev), which ships no
# CMake config. Defines MySQLCppConn::MySQLCppConn and MySQLCppConn_VERSION.
find_path(MySQLCppConn_INCLUDE_DIR NAMES cppconn/driver.h)
find_library(MySQLCppConn_LIBRARY NAMES libmysqlcppconn.so mysqlcppconn)
if(MySQLCppConn_INCLUDE_DIR AND EXISTS "${MySQLCppConn_INCLUDE_DIR}/cppconn/version_info.h")
  file(STRINGS "${MySQLCppConn_INCLUDE_DIR}/cppconn/version_info.h" _v
       REGEX "#define MYCPPCONN_DM_(MAJOR|MINOR|PATCH)_VERSION ")
  string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*MINOR_VERSION ([0-9]+).*PATCH_VERSION ([0-9]+).*"
         "\\1.\\2.\\3" MySQLCppConn_VERSION "${_v}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(MySQLCppConn
  REQUIRED_VARS MySQLCppConn_LIBRARY MySQLCppConn_INCLUDE_DIR
  VERSION_VAR MySQLCppConn_VERSION)
if(MySQLCppConn_FOUND AND NOT TARGET MySQLCppConn::MySQLCppConn)
  add_library(MySQLCppConn::MySQLCppConn SHARED IMPORTED)
  set_target_properties(MySQLCppConn::MySQLCppConn PROPERTIES
    IMPORTED_LOCATION "${MySQLCppConn_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${MySQLCppConn_INCLUDE_DIR}")
endif()
mark_as_advanced(MySQLCppConn_INCLUDE_DIR MySQLCppConn_LIBRARY)
