package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
	"github.com/ichor-dev/kubectl-ichor/pkg/releases"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// pathOptions are what the path commands (plan cluster, upgrade cluster) share: the
// targets, the intermediate releases, and how the path is planned.
type pathOptions struct {
	// Talos is --talos, the Talos target ("" leaves Talos as it runs).
	Talos string
	// Kubernetes is --kubernetes, the Kubernetes target ("" leaves it as it runs).
	Kubernetes string
	// Via is --via: the releases of the minors the path goes through.
	Via []string
	// RegistryTimeout is --registry-timeout: how long one repository's tag listing may
	// take when an intermediate Kubernetes release is looked up.
	RegistryTimeout time.Duration
	// installerOptions are --installer-image and --drop-extensions, for the path's
	// Talos hops (tagged with --talos; an earlier Talos hop takes the same repository
	// with its own tag).
	installerOptions

	targets compat.Targets
	via     []compat.Version
}

func (p *pathOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&p.Talos, "talos", "", "The Talos version to reach, vA.B.C (leave out to keep Talos as it runs)")
	cmd.Flags().StringVar(&p.Kubernetes, "kubernetes", "", "The Kubernetes version to reach, vX.Y.Z (leave out to keep Kubernetes as it runs)")
	cmd.Flags().StringSliceVar(&p.Via, "via", nil,
		"Releases of the minors the path goes through, e.g. v1.35.4,v1.36.3 (default: the newest patch of each tagged in the nodes' own image repositories)")
	cmd.Flags().DurationVar(&p.RegistryTimeout, "registry-timeout", releases.DefaultTimeout, "How long one image repository's tag listing may take")
	p.addInstallerFlags(cmd.Flags())
}

// completePath parses the targets, --via and the installer flags.
func (p *pathOptions) completePath() error {
	if p.Talos == "" && p.Kubernetes == "" {
		return errors.New("pass --talos, --kubernetes or both: the versions the path goes to, e.g. --talos v1.14.1 --kubernetes v1.37.2")
	}

	p.targets = compat.Targets{}

	for _, t := range []struct {
		flag, value string
		into        **compat.Version
	}{{"--talos", p.Talos, &p.targets.Talos}, {"--kubernetes", p.Kubernetes, &p.targets.Kubernetes}} {
		if t.value == "" {
			continue
		}

		v, err := compat.ParseVersion(t.value)
		if err != nil {
			return fmt.Errorf("%s %q: %w: pass a release vX.Y.Z", t.flag, t.value, err)
		}

		*t.into = &v
	}

	p.via = nil

	for _, s := range p.Via {
		v, err := compat.ParseVersion(s)
		if err != nil {
			return fmt.Errorf("--via %q: %w: pass releases vX.Y.Z, comma-separated", s, err)
		}

		p.via = append(p.via, v)
	}

	if len(p.InstallerImages) == 0 && len(p.DropExtensions) == 0 {
		return nil
	}

	if p.targets.Talos == nil {
		return errors.New("--installer-image and --drop-extensions are for the path's Talos hops: pass --talos too")
	}

	talos, err := stages.ParseVersion(p.targets.Talos.String())
	if err != nil {
		return err
	}

	return p.validateInstallers(talos, "--talos")
}

// hopInstallers are the operator's installers for a Talos hop to to: --installer-image
// retagged (none when none was given).
func (p *pathOptions) hopInstallers(to stages.Version) (stages.InstallerFlags, error) {
	return p.installers.Retag(to)
}

func (p *pathOptions) validate() error {
	if p.RegistryTimeout <= 0 {
		return fmt.Errorf("--registry-timeout %s: pass a duration above 0, e.g. 30s", p.RegistryTimeout)
	}

	return nil
}

// reads makes o read what a Talos hop's plan and checks read, when a Talos hop may come.
func (p *pathOptions) reads(o *planOptions) {
	if p.targets.Talos != nil {
		o.installed, o.staged, o.readEtcd = true, true, true
	}
}

// plan plans the path from the cluster o discovered, and its first hop as `plan
// kubernetes` or `plan talos` would from the cluster as it is. It returns the path
// document, and refused: the path's refusal or its first hop's (an *exitError with
// ExitRefused), nil when the path can run; err is an error that left no document.
func (p *pathOptions) plan(ctx context.Context, o *planOptions, snap *discovery.Snapshot, kube *kubeTarget) (doc *api.UpgradePath, refused, err error) {
	req := compat.Request{Nodes: compat.FromSnapshot(snap), Targets: p.targets, Via: p.via}
	planner := compat.Planner{Kubernetes: releases.Registry{Repositories: releases.KubernetesRepositories(snap), Timeout: p.RegistryTimeout}}

	path, planErr := planner.Plan(ctx, req)
	if planErr != nil && ctx.Err() != nil {
		return nil, nil, planErr
	}

	d := compat.Document(req, path, planErr)

	if planErr != nil {
		msg := planErr.Error()

		var r *compat.Refusal
		if errors.As(planErr, &r) && r.Action != "" {
			msg = r.Reason + ": " + r.Action
		}

		return &d, &exitError{code: ExitRefused, err: fmt.Errorf("path refused: %s", msg)}, nil
	}

	if len(path.Hops) == 0 {
		return &d, nil, nil
	}

	measured, err := o.measured(ctx)
	estimatePath(&d, measured, err)

	first, err := o.planHop(ctx, snap, kube, path.Hops[0], p.hopInstallers)
	if err != nil {
		return nil, nil, fmt.Errorf("hop 1 (%s %s): %w", path.Hops[0].Kind, path.Hops[0].To, err)
	}

	d.Hops[0].Plan = first
	d.Runnable = d.Runnable && first.Runnable

	if !d.Runnable {
		if err := refusal(first); err != nil {
			return &d, &exitError{code: ExitRefused, err: fmt.Errorf("hop 1: %w", err)}, nil
		}
	}

	return &d, nil, nil
}

// measured are the upgrades of the namespace's ended operations (its history, and the
// state when its operation ended), and an error when they could not be read.
func (o *planOptions) measured(ctx context.Context) (progress.Measured, error) {
	store := &job.Store{Client: o.clients.Kube.CoreV1(), Namespace: o.f.flags.namespace()}

	records, err := store.History(ctx)
	if err != nil {
		return nil, err
	}

	var ops []*api.Operation

	for _, r := range records {
		ops = append(ops, r.Operation)
	}

	if op, _, err := store.Get(ctx); err == nil && op.Status.Phase.Finished() &&
		!slices.ContainsFunc(ops, func(h *api.Operation) bool { return h.Spec.ID == op.Spec.ID }) {
		ops = append(ops, op)
	}

	return progress.MeasuredFrom(ops), nil
}

// estimatePath gives each hop of doc the median time of the upgrades of its kind the
// cluster's history measured, and the path their sum when every hop has one.
func estimatePath(doc *api.UpgradePath, m progress.Measured, err error) {
	if err != nil {
		doc.EstimateBasis = "no estimate: the history could not be read (" + text.OneLine(err.Error()) + ")"

		return
	}

	var (
		total time.Duration
		kinds []string
		all   = true
	)

	for i := range doc.Hops {
		h := &doc.Hops[i]
		kinds = append(kinds, h.Upgrade)

		d, _, ok := m.Estimate(h.Upgrade)
		if !ok {
			all = false

			continue
		}

		secs := int64(d.Round(time.Second).Seconds())
		h.EstimateSeconds = &secs
		total += d
	}

	if all {
		secs := int64(total.Round(time.Second).Seconds())
		doc.EstimateSeconds = &secs
	}

	doc.EstimateBasis = m.Basis(kinds)
}

// show discovers the cluster as o reads it, plans the path and its first hop, prints
// them as o.Output asks, and returns the path and the cluster's name; a refused path is
// the error (after it was printed).
func (p *pathOptions) show(ctx context.Context, o *planOptions) (*api.UpgradePath, string, error) {
	p.reads(o)

	snap, kube, err := o.discover(ctx)
	if err != nil {
		return nil, "", err
	}

	doc, refused, err := p.plan(ctx, o, snap, kube)
	if err != nil {
		return nil, "", err
	}

	if err := printPath(o.Out, o.Output, kube.cluster, doc); err != nil {
		return nil, "", err
	}

	if refused != nil {
		return nil, "", refused
	}

	return doc, kube.cluster, nil
}

// PlanClusterOptions are the options of `kubectl ichor plan cluster`: the upgrade path
// from what the cluster runs to a Talos and/or a Kubernetes target.
type PlanClusterOptions struct {
	planOptions
	pathOptions
}

// Complete fills the options from the command line.
func (o *PlanClusterOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.use(f)

	return o.completePath()
}

// Validate checks the options.
func (o *PlanClusterOptions) Validate() error {
	if o.MaxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: pass 1 or more", o.MaxUnavailable)
	}

	if err := o.pathOptions.validate(); err != nil {
		return err
	}

	switch o.Output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: pass -o json or -o yaml, or leave it out for the table", o.Output)
	}

	return nil
}

// Run discovers the cluster, plans the path and its first hop, and prints the path.
func (o *PlanClusterOptions) Run(ctx context.Context) error {
	defer o.printStats()

	_, _, err := o.show(ctx, &o.planOptions)

	return err
}

// planHop plans hop h from the cluster as it is, with the checks of its kind: the
// first hop of a path (the next ones start from a cluster that does not exist yet).
func (o *planOptions) planHop(ctx context.Context, snap *discovery.Snapshot, kube *kubeTarget, h compat.Hop,
	installersFor func(stages.Version) (stages.InstallerFlags, error),
) (*api.Plan, error) {
	target, err := stages.ParseVersion(h.To.String())
	if err != nil {
		return nil, err
	}

	o.target = target
	opts := stages.Options{MaxUnavailable: o.MaxUnavailable}

	var (
		plan *api.Plan
		list []checks.Check
	)

	if h.Kind == api.UpgradeTalos {
		installers, err := installersFor(target)
		if err != nil {
			return nil, err
		}

		plan, err = stages.PlanTalos(snap, target, installers, opts)
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}

		list = checks.Talos()
	} else {
		o.kubernetes = true

		plan, err = stages.PlanKubernetes(snap, target, opts)
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}

		list = checks.Kubernetes()
	}

	if err := o.evaluate(ctx, plan, kube, list); err != nil {
		return nil, err
	}

	return plan, nil
}

// printPath prints the path document as -o asks: the document, or the text.
func printPath(w io.Writer, output, cluster string, doc *api.UpgradePath) error {
	if output != "" {
		return printDocument(w, output, "path", doc)
	}

	return PrintPath(w, cluster, doc)
}

func newPlanClusterCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &PlanClusterOptions{planOptions: planOptions{IOStreams: streams}}

	cmd := &cobra.Command{
		Use:   "cluster [--talos vA.B.C] [--kubernetes vX.Y.Z]",
		Short: "Plan the upgrade path to a Talos and/or Kubernetes target: the legal hops in order, the first one's plan",
		Example: `  kubectl ichor plan cluster --talos v1.14.1 --kubernetes v1.37.2
  kubectl ichor plan cluster --kubernetes v1.36.3 --via v1.35.4
  kubectl ichor plan cluster --talos v1.14.1 --kubernetes v1.37.2 -o json`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.pathOptions.addFlags(cmd)
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "Output format: json or yaml prints the versioned UpgradePath document")
	cmd.Flags().IntVar(&o.MaxUnavailable, "max-unavailable", 1, "How many workers are upgraded at once")
	cmd.Flags().BoolVar(&o.RequestStats, "request-stats", false, "Print the number of Kubernetes requests and Talos calls made on stderr")
	_ = cmd.Flags().MarkHidden("request-stats")
	addEtcdFlags(cmd, &o.planOptions)
	o.readEtcd = false // read only when a Talos target is given (Run)

	return cmd
}
