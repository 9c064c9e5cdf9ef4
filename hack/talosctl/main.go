// Command talosctl is Talos' own talosctl with the commands that manage running
// clusters (talosctl's "Manage running Talos clusters" group: get, service,
// upgrade-k8s, version, ...), built from the Talos module pinned in go.mod, for
// the local-cluster tests. The offline commands (gen, cluster create, ...) are
// left out: they need a version of rtnetlink that this machine's module proxy
// does not serve.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	_ "github.com/siderolabs/talos/cmd/talosctl/acompat" // talosctl's gRPC environment
	"github.com/siderolabs/talos/cmd/talosctl/cmd/talos"
	"github.com/siderolabs/talos/pkg/cli"
)

func main() {
	root := &cobra.Command{
		Use:           "talosctl",
		Short:         "talosctl's commands for running Talos clusters",
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.AddCommand(talos.Commands...)
	// Interrupts cancel the context, as talosctl's own root command does.
	if _, err := cli.WithContextC(context.Background(), root.ExecuteContextC); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
