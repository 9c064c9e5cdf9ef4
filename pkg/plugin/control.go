package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// ResumeOptions are the options of `kubectl ichor resume`.
type ResumeOptions struct {
	genericiooptions.IOStreams

	f *factory

	// Detach is --detach: return once the new Job is created.
	Detach bool
}

// Complete fills the options from the command line.
func (o *ResumeOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.f = f

	return nil
}

// Validate checks the options.
func (o *ResumeOptions) Validate() error { return nil }

// Run resumes the namespace's paused (or stopped) operation with a new Job and follows it.
func (o *ResumeOptions) Run(ctx context.Context) error {
	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	op, err := ctl.Get(ctx)
	if err != nil {
		return err
	}

	if runsKubernetes(op.Spec) {
		// The manifests as they are now (the target's, past the KubeProxy stage); without
		// them the Job keeps the permissions it was given at launch.
		if access, err := o.f.manifestAccess(ctx); err == nil {
			ctl.Access = &access
		} else if !errors.Is(err, errNoManifestReader) {
			writef(o.ErrOut, "warning: could not read the bootstrap manifests through Talos (%v): the Job keeps the permissions it was given at launch\n", err)
		}
	} else {
		ctl.Access = &job.ManifestAccess{}
	}

	var talosconfig []byte

	if op.Spec.Credentials == api.CredentialsLocal {
		// A fresh copy when the talosconfig is at hand; else the copy in the cluster.
		if b, err := localTalosconfig(o.f.flags.talos); err == nil {
			talosconfig = b
		}
	}

	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), launchTimeout)
	defer cancel()

	if op, err = ctl.Resume(lctx, talosconfig); err != nil {
		return err
	}

	writef(o.Out, "Resumed operation %s: job %s/%s\n", op.Spec.ID, ctl.Namespace, op.Status.Job)

	if o.Detach {
		writef(o.Out, "Follow it with: kubectl ichor status --watch%s\n", nsFlag(ctl.Namespace))

		return nil
	}

	f := &follower{IOStreams: o.IOStreams, ctl: ctl, live: o.f.deps.job.terminal(o.Out), poll: o.f.deps.job.poll, now: o.f.deps.job.now}

	return f.run(ctx)
}

func newResumeCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &ResumeOptions{IOStreams: streams}

	cmd := &cobra.Command{
		Use:   "resume",
		Short: "Continue a paused upgrade with a new Job, from where the cluster is, and follow it",
		Example: `  kubectl ichor resume
  kubectl ichor resume --detach`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	cmd.Flags().BoolVar(&o.Detach, "detach", false, "Return once the new Job is created")

	return cmd
}

// AbortOptions are the options of `kubectl ichor abort`.
type AbortOptions struct {
	genericiooptions.IOStreams

	f *factory
}

// Complete fills the options from the command line.
func (o *AbortOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.f = f

	return nil
}

// Validate checks the options.
func (o *AbortOptions) Validate() error { return nil }

// Run aborts the namespace's operation and says what it did.
func (o *AbortOptions) Run(ctx context.Context) error {
	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	res, err := ctl.Abort(ctx)
	if err != nil {
		return err
	}

	switch {
	case res.StateMissing:
		of := "an operation"
		if res.Operation != "" {
			of = "operation " + res.Operation
		}

		writef(o.Out, "The state of namespace %s was missing (configmap %s/%s deleted, or pruned by a GitOps tool): "+
			"cleaned up what %s left, found by its labels\n", ctl.Namespace, ctl.Namespace, job.StateName, of)
	case res.StateErr != nil:
		writef(o.Out, "Stopped the upgrade Jobs of namespace %s (the state could not be read: %v)\n", ctl.Namespace, res.StateErr)
	case res.Was == api.PhaseAborted:
		writef(o.Out, "Operation %s was already aborted; cleaned up again\n", res.Operation)
	case res.Was == api.PhaseSucceeded:
		writef(o.Out, "Operation %s succeeded: it stays Succeeded; cleaned up what its end left\n", res.Operation)
	default:
		writef(o.Out, "Aborted operation %s (it was %s)\n", res.Operation, res.Was)

		if len(res.Path) > 0 {
			writef(o.Out, "  %s\n", hopsDone(res.Path, res.HopsDone))
		}
	}

	for _, j := range res.Jobs {
		writef(o.Out, "  stopped job %s/%s\n", ctl.Namespace, j)
	}

	switch {
	case len(res.Uncordoned) > 0:
		writef(o.Out, "  uncordoned %s\n", strings.Join(res.Uncordoned, ", "))
	case len(res.KeptHeld) == 0:
		writef(o.Out, "  no node was left cordoned\n")
	}

	if len(res.KeptHeld) > 0 {
		why := "the upgrade succeeded without it and left it cordoned on purpose"
		if res.Was != api.PhaseSucceeded {
			why = "without the state ichor cannot tell whether an upgrade left it cordoned on purpose"
		}

		writef(o.Out, "  left cordoned %s: held (%s) and cordoned by ichor; %s: kubectl uncordon %s once fit, "+
			"or remove the hold (kubectl annotate node %s %s-) and upgrade again\n",
			strings.Join(res.KeptHeld, ", "), discovery.HoldAnnotation, why, strings.Join(res.KeptHeld, " "), res.KeptHeld[0], discovery.HoldAnnotation)
	}

	if res.Released {
		writef(o.Out, "  released the lock %s/%s\n", job.LockNamespace, job.LockName)
	}

	if len(res.Removed) > 0 {
		writef(o.Out, "  removed the Job's credentials: %s\n", strings.Join(res.Removed, ", "))
	} else {
		writef(o.Out, "  no credential of the Job was left\n")
	}

	if res.StateErr == nil && !res.StateMissing {
		writef(o.Out, "  the state stays in configmap %s/%s for the record\n", ctl.Namespace, job.StateName)
	}

	return nil
}

func newAbortCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &AbortOptions{IOStreams: streams}

	return &cobra.Command{
		Use:   "abort",
		Short: "Stop the upgrade for good: stop its Job, uncordon the nodes it cordoned, release the lock, remove the Job's credentials",
		Args:  cobra.NoArgs,
		RunE:  runCommand(f, o),
	}
}

// runsKubernetes reports whether an operation runs a Kubernetes upgrade (its own, or a
// hop of its path): the Job then needs access to the bootstrap manifests' objects.
func runsKubernetes(spec api.OperationSpec) bool {
	return slices.ContainsFunc(spec.Runs(), func(h api.HopSpec) bool { return h.Upgrade == api.UpgradeKubernetes })
}

// hopsDone says which of a path's hops were done, and which were not run.
func hopsDone(path []api.HopSpec, done []api.HopStatus) string {
	if len(done) == 0 {
		return fmt.Sprintf("no hop of the path's %d was done", len(path))
	}

	var did, left []string

	for i, h := range path {
		label := fmt.Sprintf("%d/%d %s", i+1, len(path), h.Label())
		if slices.ContainsFunc(done, func(d api.HopStatus) bool { return d.Number == i+1 }) {
			did = append(did, label)
		} else {
			left = append(left, label)
		}
	}

	out := fmt.Sprintf("hops done: %s", strings.Join(did, ", "))
	if len(left) > 0 {
		out += "; not done: " + strings.Join(left, ", ")
	}

	return out
}
