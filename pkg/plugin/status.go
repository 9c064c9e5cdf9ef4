package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// StatusOptions are the options of `kubectl ichor status`.
type StatusOptions struct {
	genericiooptions.IOStreams

	flags *globalFlags
	deps  deps

	// Output is -o: "" for the view, json or yaml for the Operation document.
	Output string
	// Watch is --watch: follow the operation until it ends.
	Watch bool
}

// Complete fills the options from the command line.
func (o *StatusOptions) Complete(*cobra.Command, []string) error { return nil }

// Validate checks the options.
func (o *StatusOptions) Validate() error {
	switch o.Output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: pass -o json or -o yaml, or leave it out for the view", o.Output)
	}

	if o.Output != "" && o.Watch {
		return errors.New("-o and --watch do not go together: pass one of them")
	}

	return nil
}

// Run prints the operation of the namespace, or follows it with --watch.
func (o *StatusOptions) Run(ctx context.Context) error {
	ctl, err := o.deps.job.controlFor(o.flags)
	if err != nil {
		return err
	}

	if o.Watch {
		f := &follower{IOStreams: o.IOStreams, ctl: ctl, live: o.deps.job.terminal(o.Out), poll: o.deps.job.poll, now: o.deps.job.now}

		return f.run(ctx)
	}

	op, err := ctl.Get(ctx)
	if err != nil {
		return err
	}

	switch o.Output {
	case "json":
		b, err := json.MarshalIndent(op, "", "  ")
		if err != nil {
			return fmt.Errorf("encode operation: %w", err)
		}

		writef(o.Out, "%s\n", b)

		return nil
	case "yaml":
		b, err := yaml.Marshal(op)
		if err != nil {
			return fmt.Errorf("encode operation: %w", err)
		}

		writef(o.Out, "%s", b)

		return nil
	}

	v := view{op: op, now: o.deps.job.now()}

	if raw, err := ctl.Store().Plan(ctx); err == nil && raw != nil {
		var p api.Plan
		if json.Unmarshal(raw, &p) == nil {
			v.plan = &p
		}
	}

	if p, err := ctl.Diagnose(ctx, op); err == nil && p != nil {
		v.problem = p.Message
	}

	printOnce(o.Out, v)

	return nil
}

func newStatusCommand(streams genericiooptions.IOStreams, flags *globalFlags, deps deps) *cobra.Command {
	o := &StatusOptions{IOStreams: streams, flags: flags, deps: deps}

	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the upgrade operation of the namespace: phase, stage, every node's step",
		Example: `  kubectl ichor status
  kubectl ichor status --watch
  kubectl ichor status -o json | jq -r .status.phase`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(cmd, args); err != nil {
				return err
			}

			if err := o.Validate(); err != nil {
				return err
			}

			return o.Run(cmd.Context())
		},
	}

	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "Output format: json or yaml prints the versioned Operation document")
	cmd.Flags().BoolVarP(&o.Watch, "watch", "w", false, "Follow the operation until it ends (Ctrl-C stops following, not the upgrade)")

	return cmd
}
