// Package soft is a pure-Go software RDMA device implementing every ibv
// interface with the IBTA semantics of REFERENCE.md. Work in progress: this
// file fixes the public API first.
package soft
