package plugin

import (
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
func (o *VersionOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the options.
func (o *VersionOptions) Validate() error { return nil }

// Run prints the plugin's version.
func (o *VersionOptions) Run() error {
	_, err := fmt.Fprintln(o.Out, version.Version)

	return err
}

func newVersionCommand(streams genericiooptions.IOStreams) *cobra.Command {
	o := &VersionOptions{IOStreams: streams}

	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}

			if err := o.Validate(); err != nil {
				return err
			}

			return o.Run()
		},
	}
}
