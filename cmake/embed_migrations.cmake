# Generates a C++ source holding the migrations of one backend, so the
# library can apply its own schema without the files at run time.
# Usage: cmake -DBACKEND=sqlite -DSCHEMA_DIR=... -DOUTPUT=... -P embed_migrations.cmake
file(GLOB files "${SCHEMA_DIR}/[0-9][0-9][0-9]_*.sql")
list(SORT files)
set(body "")
foreach(f IN LISTS files)
  get_filename_component(name "${f}" NAME_WE)
  string(SUBSTRING "${name}" 0 3 version)
  math(EXPR version "${version}")
  file(READ "${f}" sql)
  string(APPEND body "    {${version}, \"${name}\", R\"orpheus_sql(${sql})orpheus_sql\"},\n")
endforeach()
file(WRITE "${OUTPUT}.tmp" "// Generated from schema/${BACKEND}; do not edit.
#include <vector>
#include \"orpheus/detail/migration.hpp\"
namespace orpheus::detail {
const std::vector<migration>& ${BACKEND}_migrations() {
  static const std::vector<migration> all = {
${body}  };
  return all;
}
}  // namespace orpheus::detail
")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
