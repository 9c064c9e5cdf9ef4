package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/planning"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

func newPlanCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Show what an upgrade would do, and whether it can run; changes nothing",
		Args:  cobra.NoArgs,
	}

	cmd.AddCommand(newPlanKubernetesCommand(streams, f), newPlanTalosCommand(streams, f), newPlanClusterCommand(streams, f))

	return cmd
}

// planOptions are the options every plan command shares.
type planOptions struct {
	genericiooptions.IOStreams

	f *factory

	// To is --to, the target version.
	To string
	// Output is -o: "" for the table, "json" or "yaml" for the Plan document.
	Output string
	// MaxUnavailable is --max-unavailable: how many workers move at once.
	MaxUnavailable int
	// RequestStats is the hidden --request-stats: count the Kubernetes requests and Talos
	// calls and print the counts on stderr at the end.
	RequestStats bool
	// AllowEtcdOutage is --allow-etcd-outage (Talos): a control plane's reboot may stop a
	// one- or two-member etcd.
	AllowEtcdOutage bool
	// ManifestsForce is --manifests-force (Kubernetes): the bootstrap manifest objects
	// whose fields another field manager owns that the sync takes over ("all" for every
	// one).
	ManifestsForce []string

	// kubernetes is true for a Kubernetes plan: its bootstrap manifests check dry-runs
	// the manifests at the target.
	kubernetes bool

	// readEtcd makes discover read etcd through the control planes (a Talos plan).
	readEtcd bool
	// installed makes discovery read each node's system extensions and
	// schematic too (a Talos upgrade keeps them).
	installed bool
	// staged makes discovery read each node's persistent machine config, for the staged
	// config check (a Talos plan): the upgrade's reboot would activate a staged change.
	staged bool

	target stages.Version
	stats  *requestStats
	// clients and cluster are what discover read with and read.
	clients planning.Clients
	cluster *planning.Cluster
}

// addManifestsForceFlag adds --manifests-force (the Kubernetes commands).
func (o *planOptions) addManifestsForceFlag(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&o.ManifestsForce, "manifests-force", nil,
		`Bootstrap manifest objects ("Kind namespace/name", repeatable) whose fields changed by another field manager (Helm, kubectl) `+
			`the manifest sync takes over; "all" for every object. Without it such objects are skipped and said (fields Talos' own `+
			`earlier writes hold are taken over without it)`)
}

func (o *planOptions) addFlags(cmd *cobra.Command, example string) {
	cmd.Flags().StringVar(&o.To, "to", "", "The version to upgrade to, vX.Y.Z (required), e.g. "+example)
	cmd.Flags().StringVarP(&o.Output, "output", "o", "", "Output format: json or yaml prints the versioned Plan document")
	cmd.Flags().IntVar(&o.MaxUnavailable, "max-unavailable", 1, "How many workers are upgraded at once")
	cmd.Flags().BoolVar(&o.RequestStats, "request-stats", false, "Print the number of Kubernetes requests and Talos calls made on stderr")
	_ = cmd.Flags().MarkHidden("request-stats")
}

// use takes the factory, its Kubernetes clients counting their requests when
// --request-stats asks.
func (o *planOptions) use(f *factory) {
	o.f = f

	if o.RequestStats {
		o.stats = newRequestStats()
		f.flags.kube.WrapConfigFn = o.stats.wrapKube
	}
}

// complete takes the factory and parses --to.
func (o *planOptions) complete(f *factory) error {
	o.use(f)

	if o.To == "" {
		return errors.New("--to is required: pass the version to upgrade to, e.g. --to v1.36.3")
	}

	target, err := stages.ParseVersion(o.To)
	if err != nil {
		return fmt.Errorf("--to: %w", err)
	}

	o.target = target

	return nil
}

// printStats prints the request counts when --request-stats asks.
func (o *planOptions) printStats() {
	if o.stats != nil {
		o.stats.print(o.ErrOut)
	}
}

func (o *planOptions) validate() error {
	if o.MaxUnavailable < 1 {
		return fmt.Errorf("--max-unavailable %d: pass 1 or more", o.MaxUnavailable)
	}

	for _, f := range o.ManifestsForce {
		if kind, name, ok := strings.Cut(f, " "); f != kube.ForceAll && (!ok || kind == "" || name == "" || strings.Contains(name, " ")) {
			return fmt.Errorf(`--manifests-force %q: name an object as "Kind namespace/name" (e.g. "DaemonSet kube-system/kube-flannel"), "Kind name" for a cluster-scoped one, or pass all`, f)
		}
	}

	switch o.Output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: pass -o json or -o yaml, or leave it out for the table", o.Output)
	}

	return nil
}

// discover reads the cluster through the Kubernetes and Talos APIs (planning.Read).
func (o *planOptions) discover(ctx context.Context) (*discovery.Snapshot, *kubeTarget, error) {
	kube, err := o.f.Kube()
	if err != nil {
		return nil, nil, err
	}

	talos, err := o.f.Talos(ctx)
	if err != nil {
		return nil, nil, err
	}

	if o.stats != nil {
		talos = o.stats.wrapTalos(talos)
	}

	o.clients = planning.Clients{Kube: kube.client, Dynamic: kube.dynamic, Endpoint: kube.endpoint, Metrics: kube.metrics, Talos: talos}

	o.cluster, err = planning.Read(ctx, o.clients, planning.Reads{Installed: o.installed, Staged: o.staged, Etcd: o.readEtcd})
	if err != nil {
		return nil, nil, err
	}

	return o.cluster.Snapshot, kube, nil
}

// finish runs the checks, prints the plan and returns the refusal, if any.
func (o *planOptions) finish(ctx context.Context, plan *api.Plan, kube *kubeTarget, list []checks.Check) error {
	if err := o.evaluate(ctx, plan, kube, list); err != nil {
		return err
	}

	if err := printPlan(o.Out, o.Output, plan); err != nil {
		return err
	}

	return refusal(plan)
}

// evaluate previews the plan's drains and runs its checks against o.target
// (planning.Evaluate).
func (o *planOptions) evaluate(ctx context.Context, plan *api.Plan, kube *kubeTarget, list []checks.Check) error {
	plan.Cluster.Name = kube.cluster

	return planning.Evaluate(ctx, o.clients, o.cluster, plan, planning.Checking{
		Target:          o.target,
		Namespace:       o.f.flags.namespace(),
		AllowEtcdOutage: o.AllowEtcdOutage,
		DryRunManifests: o.kubernetes,
		ManifestsForce:  o.ManifestsForce,
		Checks:          list,
	})
}

// refusal is the error of a plan a check refused; nil when it can run.
func refusal(plan *api.Plan) error {
	if plan.Runnable {
		return nil
	}

	var refusedChecks []string

	for _, c := range plan.Checks {
		if c.Result == api.ResultRefused {
			refusedChecks = append(refusedChecks, c.Name)
		}
	}

	return &exitError{code: ExitRefused, err: fmt.Errorf("plan refused by %s: do what their DETAIL says and plan again",
		strings.Join(refusedChecks, ", "))}
}

func printPlan(w io.Writer, output string, plan *api.Plan) error {
	if output != "" {
		return printDocument(w, output, "plan", plan)
	}

	return PrintTable(w, plan)
}

// PlanKubernetesOptions are the options of `kubectl ichor plan kubernetes`.
type PlanKubernetesOptions struct {
	planOptions
}

// Complete fills the options from the command line.
func (o *PlanKubernetesOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	return o.complete(f)
}

// Validate checks the options.
func (o *PlanKubernetesOptions) Validate() error { return o.validate() }

// Run discovers the cluster, plans the upgrade, runs the checks and prints the plan.
func (o *PlanKubernetesOptions) Run(ctx context.Context) error {
	defer o.printStats()

	snap, kube, err := o.discover(ctx)
	if err != nil {
		return err
	}

	plan, err := stages.PlanKubernetes(snap, o.target, stages.Options{MaxUnavailable: o.MaxUnavailable})
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}

	return o.finish(ctx, plan, kube, checks.Kubernetes())
}

func newPlanKubernetesCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &PlanKubernetesOptions{planOptions{IOStreams: streams, kubernetes: true}}

	cmd := &cobra.Command{
		Use:   "kubernetes --to vX.Y.Z",
		Short: "Plan a Kubernetes upgrade: stages, nodes in order, what changes, checks",
		Example: `  kubectl ichor plan kubernetes --to v1.37.2
  kubectl ichor plan kubernetes --to v1.37.2 --max-unavailable 2 -o yaml`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.addFlags(cmd, "v1.37.2")
	o.addManifestsForceFlag(cmd)

	return cmd
}

// PlanTalosOptions are the options of `kubectl ichor plan talos`.
type PlanTalosOptions struct {
	planOptions
	installerOptions
}

// Complete fills the options from the command line.
func (o *PlanTalosOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	return o.complete(f)
}

// Validate checks the options.
func (o *PlanTalosOptions) Validate() error {
	if err := o.validate(); err != nil {
		return err
	}

	return o.validateInstallers(o.target, "--to")
}

// Run discovers the cluster, plans the Talos upgrade, runs the checks and prints the plan.
func (o *PlanTalosOptions) Run(ctx context.Context) error {
	defer o.printStats()

	o.installed = true
	o.staged = true

	snap, kube, err := o.discover(ctx)
	if err != nil {
		return err
	}

	plan, err := stages.PlanTalos(snap, o.target, o.installers, stages.Options{MaxUnavailable: o.MaxUnavailable})
	if err != nil {
		return fmt.Errorf("plan: %w", err)
	}

	return o.finish(ctx, plan, kube, checks.Talos())
}

func newPlanTalosCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &PlanTalosOptions{planOptions: planOptions{IOStreams: streams}}

	cmd := &cobra.Command{
		Use:   "talos --to vA.B.C",
		Short: "Plan a Talos OS upgrade: upgrade path, Kubernetes pairing, installer per node, order, checks",
		Example: `  kubectl ichor plan talos --to v1.14.1
  kubectl ichor plan talos --to v1.14.1 --installer-image worker-1=factory.talos.dev/metal-installer/<schematic>:v1.14.1`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.addFlags(cmd, "v1.14.1")
	o.addInstallerFlags(cmd.Flags())
	addEtcdFlags(cmd, &o.planOptions)

	return cmd
}
