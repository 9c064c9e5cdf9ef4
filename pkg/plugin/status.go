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
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
)

// StatusOptions are the options of `kubectl ichor status`.
type StatusOptions struct {
	genericiooptions.IOStreams

	f *factory

	// Output is -o: "" for the view, json or yaml for the Operation document.
	Output string
	// Watch is --watch: follow the operation until it ends.
	Watch bool
	// Operation is --operation: an ended operation of the history, by ID.
	Operation string
}

// Complete fills the options from the command line.
func (o *StatusOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.f = f

	return nil
}

// Validate checks the options.
func (o *StatusOptions) Validate() error {
	switch o.Output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: pass -o json or -o yaml, or leave it out for the view", o.Output)
	}

	if o.Operation != "" && o.Watch {
		return errors.New("--operation and --watch do not go together: an operation of the history has ended")
	}

	if o.Output == "yaml" && o.Watch {
		return errors.New("-o yaml and --watch do not go together: --watch -o json streams one JSON document per change")
	}

	return nil
}

// Run prints the operation of the namespace, or follows it with --watch.
func (o *StatusOptions) Run(ctx context.Context) error {
	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	if o.Watch {
		f := &follower{IOStreams: o.IOStreams, ctl: ctl, live: o.f.deps.job.terminal(o.Out), poll: o.f.deps.job.poll, now: o.f.deps.job.now,
			jsonLines: o.Output == "json"}

		return f.run(ctx)
	}

	var (
		op      *api.Operation
		plan    *api.Plan
		current = o.Operation == ""
	)

	if current {
		if op, err = ctl.Get(ctx); err != nil {
			return err
		}

		stored, err := storedPlan(ctx, ctl)
		if err != nil {
			return err
		}

		plan = stored.planOf(op)
	} else {
		rec, err := ctl.Store().Find(ctx, o.Operation)
		if err != nil {
			return err
		}

		op, plan = rec.Operation, decodePlan(rec.Plan).planOf(rec.Operation)
	}

	doc := statusDocument{Operation: op, Progress: progress.Of(op, plan, o.f.deps.job.now())}

	switch o.Output {
	case "json":
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return fmt.Errorf("encode operation: %w", err)
		}

		writef(o.Out, "%s\n", b)

		return nil
	case "yaml":
		b, err := yaml.Marshal(doc)
		if err != nil {
			return fmt.Errorf("encode operation: %w", err)
		}

		writef(o.Out, "%s", b)

		return nil
	}

	v := view{op: op, now: o.f.deps.job.now(), plan: plan}

	if current {
		if p, err := ctl.Diagnose(ctx, op); err == nil && p != nil {
			v.problem = p.Message
		}
	}

	printOnce(o.Out, v)

	if op.Status.Phase.Finished() {
		for _, l := range summaryLines(op, plan) {
			writef(o.Out, "%s\n", l)
		}
	}

	if current {
		if history, err := ctl.Store().History(ctx); err == nil {
			for _, l := range historyLines(history, op.Spec.ID, ctl.Namespace) {
				writef(o.Out, "%s\n", l)
			}
		}
	}

	return nil
}

// statusDocument is what status -o json|yaml prints: the Operation
// document (apiVersion, kind, spec, status) with its progress, computed
// when asked.
type statusDocument struct {
	*api.Operation

	Progress progress.Progress `json:"progress"`
}

// confirmed is what an operation was confirmed with, as its state keeps it: the Plan
// of a plain operation, or the UpgradePath of a path (whose first hop alone has a plan).
type confirmed struct {
	plan *api.Plan
	path *api.UpgradePath
}

// planOf is the plan of the upgrade op is in: the operation's, or its path's first hop's
// while that hop runs; nil when none is known (a later hop is planned by its runner).
func (c *confirmed) planOf(op *api.Operation) *api.Plan {
	switch {
	case c == nil:
		return nil
	case c.path == nil:
		return c.plan
	case op == nil || len(c.path.Hops) == 0 || op.Status.NextHop() > 1:
		return nil
	}

	return c.path.Hops[0].Plan
}

// storedPlan is what the operation was confirmed with, nil when the state holds none or
// cannot be read a moment; a plan the state holds but that cannot be unpacked is the
// state's *job.CorruptStateError.
func storedPlan(ctx context.Context, ctl *job.Control) (*confirmed, error) {
	raw, err := ctl.Store().Plan(ctx)

	var corrupt *job.CorruptStateError
	if errors.As(err, &corrupt) {
		return nil, err
	}

	if err != nil {
		return nil, nil
	}

	return decodePlan(raw), nil
}

func decodePlan(raw []byte) *confirmed {
	if len(raw) == 0 {
		return nil
	}

	var kind struct {
		Kind string `json:"kind"`
	}

	if json.Unmarshal(raw, &kind) != nil {
		return nil
	}

	if kind.Kind == api.KindUpgradePath {
		var p api.UpgradePath
		if json.Unmarshal(raw, &p) != nil {
			return nil
		}

		return &confirmed{path: &p}
	}

	var p api.Plan
	if json.Unmarshal(raw, &p) != nil {
		return nil
	}

	return &confirmed{plan: &p}
}

func newStatusCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &StatusOptions{IOStreams: streams}

	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the upgrade operation of the namespace: phase, stage, every node's step",
		Example: `  kubectl ichor status
  kubectl ichor status --watch
  kubectl ichor status --operation kubernetes-v1-36-3-7kq2x
  kubectl ichor status -o json | jq -r .status.phase
  kubectl ichor status --watch -o json | jq -c '{phase: .status.phase, done: .progress.done, left: .progress.remainingSeconds}'`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "Output format: json or yaml prints the versioned Operation document with its progress; with --watch, json prints one document per change (JSON lines)")
	cmd.Flags().StringVar(&o.Operation, "operation", "", "Show an operation of the namespace by ID: the current one or one of the last "+
		fmt.Sprint(job.HistoryKeep)+" ended (status lists them)")
	cmd.Flags().BoolVarP(&o.Watch, "watch", "w", false, "Follow the operation until it ends (Ctrl-C stops following, not the upgrade)")

	return cmd
}
