package plugin

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

// VersionOptions are the options of `kubectl ichor version`.
type VersionOptions struct {
	genericiooptions.IOStreams
}

// Complete fills the options from the command line.
func (o *VersionOptions) Complete(*factory, *cobra.Command, []string) error { return nil }

// Validate checks the options.
func (o *VersionOptions) Validate() error { return nil }

// Run prints the plugin's version.
func (o *VersionOptions) Run(context.Context) error {
	_, err := fmt.Fprintln(o.Out, version.Version)

	return err
}

func newVersionCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &VersionOptions{IOStreams: streams}

	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		RunE:  runCommand(f, o),
	}
}
