// docs/guide.md: creating the application's own tables on SQLite.
#include <sqlite3.h>

#include <stdexcept>
#include <string>

// @snippet: the example goes here
