// docs/guide.md: creating and writing the application's own tables on SQLite.
#include <idemgate/store/sqlite.hpp>

#include <sqlite3.h>

#include <stdexcept>
#include <string>

// @snippet: the example goes here
