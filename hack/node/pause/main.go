// Command pause is the sandbox (pod infrastructure) process for the local
// real node: it holds the pod's namespaces open until the runtime stops it.
//
// It does what the upstream pause image does and nothing more: as PID 1 of
// a pod that shares its PID namespace it inherits orphaned processes, so it
// reaps them, and it exits at once on SIGTERM or SIGINT so that sandbox
// teardown never waits for a kill timeout.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Subscribed before anything else so no SIGTERM is lost to the default
	// handler, which for PID 1 would ignore it.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		// One SIGCHLD may stand for several exits (signals coalesce), so
		// reap until none is left.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
