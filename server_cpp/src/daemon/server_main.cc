// tce-server: the per-node TCE cache daemon (daemon/daemon.h).
#include "daemon/daemon.h"

int main(int argc, char** argv) { return tce::RunDaemon(argc, argv); }
