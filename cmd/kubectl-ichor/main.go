// Command kubectl-ichor is the kubectl plugin that upgrades Talos Linux clusters:
// `kubectl ichor plan|upgrade kubernetes|talos ...`. It only wires the process to
// plugin.Run and exits with its code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/ichor-dev/kubectl-ichor/pkg/plugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)

	code := plugin.Run(ctx, genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}, os.Args[1:])

	stop()
	os.Exit(code)
}
