package main

import "runtime"

// isLinux: RDMA netlink exists only there.
const isLinux = runtime.GOOS == "linux"
