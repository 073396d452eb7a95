// Package churn is a connection-churn simulator for the IPoIB-CM receive
// side (package ipoibcm): seeded peers connect, send, and either disconnect
// cleanly (DREQ) or vanish without a word, and the simulator reports how
// many QPs each of ipoib_cm.c's lists holds over time, the connections
// rejected, the QPs quarantined or never reaped, and how long a closed
// connection takes to be reaped.
//
// Peers are real RC QPs, on a second device of the same soft fabric or, on
// a real device, on the same device in loopback; every message is a real
// SEND into the SRQ or the connection's receive ring. Time is virtual by
// default: a run of hours takes seconds, the kernel's timers apply as they
// are, and the same seed on the same device gives the same run, which the
// tests hold to a golden summary. Config.RealTime runs the same schedule on
// the real clock, at a scale a real device in a VM can serve.
//
// The schedule: connection requests arrive as a Poisson process
// (Config.ConnectRate); each accepted connection lives an exponentially
// distributed time (Config.Lifetime), receives messages as a Poisson
// process (Config.SendRate), and ends with a DREQ or, with probability
// Config.VanishFraction, by its peer vanishing, which only the stale task
// notices. Every connect, send, disconnect and vanish is one event.
package churn
