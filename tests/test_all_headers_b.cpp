#include "all_headers.hpp"

int all_headers_b_marker() {
  return static_cast<int>(idemgate::Key::size);
}
