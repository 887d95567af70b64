#include <idemgate/store/postgres.hpp>

#include <string>

int main() {
  // Only proves that the installed postgres target compiles and links.
  return idemgate::PostgresStore::schema_sql().find("idemgate_log") == std::string::npos;
}
