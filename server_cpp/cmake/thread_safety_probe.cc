// Must NOT compile under TCE_THREAD_SAFETY_WERROR: it reads a GUARDED_BY
// member without its mutex. CMakeLists.txt checks that the compiler refuses
// it, so a build that silently lost the check fails to configure.
#include "common/mutex.h"

struct Probe {
  tce::Mutex mu;
  int value GUARDED_BY(mu) = 0;
};

int main() {
  Probe p;
  return p.value;
}
