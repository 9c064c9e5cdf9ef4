// Command ichor-sim runs the local simulated Talos cluster that kubectl-ichor's
// tests and `make demo` use: a real Kubernetes control plane with simulated
// Talos machines and kubelets.
//
//	ichor-sim up --dir DIR [--control-planes N] [--workers M] [--kubernetes vX.Y.Z] [--talos vA.B.C] ...
//	ichor-sim down --dir DIR
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		var exit exitError
		if !errors.As(err, &exit) {
			fmt.Fprintln(os.Stderr, "ichor-sim: "+err.Error())
		}
		os.Exit(1)
	}
}

// exitError is an error already reported to the user.
type exitError struct{ error }
