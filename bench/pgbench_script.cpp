// Prints the pgbench baseline generated from the store's own statements, so the database's
// ceiling is always measured on exactly the SQL the gate sends.
//
//   pgbench_script event      one gated event: the reservation (autocommit), then BEGIN /
//                             business INSERT / fenced UPDATE / COMMIT, in the gate's order
//   pgbench_script bare       the business INSERT alone in its own transaction
//   pgbench_script defines    the -D options both scripts need, one per line
//   pgbench_script schema     the SQL that creates the log and the business table
//   pgbench_script fill TABLE N
//                             the SQL that creates TABLE as the store's log and fills it with N
//                             rows shaped like committed events (for reserve cost vs size)
//
// Every transaction uses a new key: sha256 of a number unique to the pgbench run (-D base),
// the client and the client's transaction count, as 32 bytes like a derived key.

#include "postgres_workload.hpp"

#include <idemgate/store/postgres.hpp>

#include <cctype>
#include <cstdlib>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>

namespace {

namespace pg = idemgate::bench::pg;

const std::string key_expression = "sha256(int8send(:n))";

// Replaces each positional parameter $N of `sql` by `values[N]`.
std::string with_variables(const std::string& sql, const std::map<int, std::string>& values) {
  std::string out;
  for (std::size_t i = 0; i < sql.size();) {
    if (sql[i] == '$' && i + 1 < sql.size() &&
        std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
      std::size_t end = i + 1;
      while (end < sql.size() && std::isdigit(static_cast<unsigned char>(sql[end]))) ++end;
      const int n = std::stoi(sql.substr(i + 1, end - i - 1));
      const auto it = values.find(n);
      if (it == values.end())
        throw std::runtime_error("no pgbench variable for $" + std::to_string(n) + " in " + sql);
      out += it->second;
      i = end;
    } else {
      out += sql[i++];
    }
  }
  return out;
}

std::string key_lines() {
  return "\\set seq :seq + 1\n"
         "\\set n :base + :client_id * 10000000 + :seq\n";
}

// The parameters are those PostgresStore::reserve and ::commit bind, in their order.
std::string event_script() {
  const auto sql = [](const idemgate::sql::Statement& statement) {
    return idemgate::PostgresStore::statement_sql(statement, pg::log_table);
  };
  // The holder token only has to be non-zero and this attempt's own: the transaction's number.
  const std::string gate = "'" + pg::gate_name + "'";
  const std::string reserve =
      with_variables(sql(idemgate::sql::postgres::reserve), {{1, gate},
                                                             {2, key_expression},
                                                             {3, ":fingerprint"},
                                                             {4, ":request"},
                                                             {5, ":lease_ms"},
                                                             {6, ":n"},
                                                             {7, "''"}});
  const std::string commit =
      with_variables(sql(idemgate::sql::postgres::commit),
                     {{1, gate}, {2, key_expression}, {3, ":fence"}, {4, ":result"}});
  const std::string business =
      with_variables(pg::business_insert_sql(), {{1, key_expression}, {2, ":outcome"}});
  // The reservation's result columns are unnamed, so pgbench cannot keep its fence (\gset);
  // every key is new, so the fence is always the first one, 1, as the gate would pass it.
  // The gate runs the business write first and the fenced update last (it sends the update
  // unprepared, with literals, through libpqxx's checked path); pgbench prepares every statement.
  return "-- One gated event, generated from PostgresStore::statement_sql(…, \"" + pg::log_table +
         "\").\n" + key_lines() + "-- The reservation, in autocommit.\n" + reserve + ";\n" +
         "-- The commit: business write and fenced status update in one transaction.\n"
         "BEGIN;\n" +
         business + ";\n" + commit + ";\nCOMMIT;\n";
}

std::string bare_script() {
  return "-- The business INSERT alone in its own transaction.\n" + key_lines() + "BEGIN;\n" +
         with_variables(pg::business_insert_sql(), {{1, key_expression}, {2, ":outcome"}}) +
         ";\nCOMMIT;\n";
}

void print_defines() {
  const std::string request = pg::request_bytes();
  const auto fingerprint = idemgate::detail::sha256(request);
  std::cout << "-Dseq=0\n-Dfence=1\n"
            << "-Dfingerprint="
            << pg::bytea_text(
                   {reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()})
            << "\n-Drequest=" << pg::bytea_text(request) << "\n-Dlease_ms=" << pg::lease_ms()
            << "\n-Dresult=" << pg::bytea_text(pg::outcome_bytes())
            << "\n-Doutcome=" << idemgate::bench::outcome() << '\n';
}

// Rows like those a day of committed events leaves: random 32-byte keys, the benchmark's
// request and outcome, timestamps spread over the last day.
std::string fill_sql(const std::string& table, long long rows) {
  const std::string request = pg::request_bytes();
  const auto fingerprint = idemgate::detail::sha256(request);
  const std::string fingerprint_text =
      pg::bytea_text({reinterpret_cast<const char*>(fingerprint.data()), fingerprint.size()});
  return "DROP TABLE IF EXISTS " + table + ", " + table + "_mismatches;\n" +
         idemgate::PostgresStore::schema_sql(table) + "INSERT INTO " + table +
         " (gate, key, status, fence, lease_until, fingerprint, request, result, created_at,"
         " updated_at) SELECT '" +
         pg::gate_name + "', sha256(int8send(-g)), 'committed', 1, t + interval '2 minutes', '" +
         fingerprint_text + "'::bytea, '" + pg::bytea_text(request) + "'::bytea, '" +
         pg::bytea_text(pg::outcome_bytes()) + "'::bytea, t, t FROM generate_series(1, " +
         std::to_string(rows) +
         ") AS g, LATERAL (SELECT now() - (g % 86400) * interval '1 "
         "second') AS at(t);\nVACUUM ANALYZE " +
         table + ";\n";
}

int usage() {
  std::cerr << "usage: pgbench_script event|bare|defines|schema|fill TABLE ROWS\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string_view what = argv[1];
  if (what == "event") {
    std::cout << event_script();
  } else if (what == "bare") {
    std::cout << bare_script();
  } else if (what == "defines") {
    print_defines();
  } else if (what == "schema") {
    std::cout << idemgate::PostgresStore::schema_sql(pg::log_table) << pg::business_schema_sql()
              << ";\n";
  } else if (what == "fill" && argc == 4) {
    std::cout << fill_sql(idemgate::detail::checked_table_name(argv[2]), std::atoll(argv[3]));
  } else {
    return usage();
  }
  return 0;
}
