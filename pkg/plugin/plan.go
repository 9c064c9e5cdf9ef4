package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
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

	// readEtcd makes discover read etcd through the control planes (a Talos plan); etcd
	// is what it read.
	readEtcd bool
	etcd     *stages.EtcdView

	target stages.Version
	stats  *requestStats
	// installed makes discovery read each node's system extensions and
	// schematic too (a Talos upgrade keeps them).
	installed bool
	// staged makes discovery read each node's persistent machine config, for the staged
	// config check (a Talos plan): the upgrade's reboot would activate a staged change.
	staged bool
	// manifests are a control plane's bootstrap manifests, read by discover for the
	// manifests check.
	manifests     []*unstructured.Unstructured
	manifestsNode string
	manifestsErr  error
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

// discover reads the cluster through the Kubernetes and Talos APIs.
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

	d := &discovery.Discoverer{Kube: kube.client, Endpoint: kube.endpoint, Talos: talos}

	if o.installed {
		r, ok := capable[discovery.InstalledReader](talos)
		if !ok {
			return nil, nil, errors.New("this Talos client cannot read the nodes' system extensions")
		}

		d.Installed = r
	}

	if o.staged {
		if r, ok := capable[discovery.PersistentReader](talos); ok {
			d.Persistent = r
		}
	}

	snap, err := d.Discover(ctx)
	if err != nil {
		return nil, nil, err
	}

	if mr, ok := capable[manifestReader](talos); ok {
		for _, n := range snap.Nodes {
			if n.ControlPlane && !n.Held && n.IsTalos() && n.InternalIP != "" {
				o.manifestsNode = n.Name
				o.manifests, o.manifestsErr = mr.Manifests(ctx, n.InternalIP)

				break
			}
		}
	}

	if o.readEtcd {
		o.etcd = readEtcd(ctx, talos, snap)
	}

	return snap, kube, nil
}

// finish runs the checks, prints the plan and returns the refusal, if any.
func (o *planOptions) finish(ctx context.Context, plan *api.Plan, kube *kubeTarget, snap *discovery.Snapshot, list []checks.Check) error {
	if err := o.evaluate(ctx, plan, kube, snap, list); err != nil {
		return err
	}

	if err := printPlan(o.Out, o.Output, plan); err != nil {
		return err
	}

	return refusal(plan)
}

// evaluate previews the plan's drains and runs its checks against o.target.
func (o *planOptions) evaluate(ctx context.Context, plan *api.Plan, kube *kubeTarget, snap *discovery.Snapshot, list []checks.Check) error {
	plan.Cluster.Name = kube.cluster

	d := &discovery.Discoverer{Kube: kube.client, Endpoint: kube.endpoint}

	workloads, err := d.Workloads(ctx)
	if err != nil {
		return err
	}

	plan.Drains = checks.PreviewDrains(ctx, snap, workloads, plan)
	plan.Checks = checks.Run(ctx, list, &checks.Input{
		Snapshot:        snap,
		Target:          o.target,
		Namespace:       o.f.flags.namespace(),
		Metrics:         kube.metrics,
		Drains:          plan.Drains,
		Etcd:            o.etcd,
		AllowEtcdOutage: o.AllowEtcdOutage,
		Manifests:       o.manifestFindings(ctx, kube, snap),
	})
	plan.Runnable = !checks.Refused(plan.Checks)

	return nil
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

// manifestFindings dry-runs the manifests discover read, server-side with the
// operator's credentials, as the run will sync them: rendered for the target
// (stages.ManifestsAtTarget, as Talos re-renders them once the node runs kube-proxy at
// the target) and through the same ManifestApplier.Check with the same
// --manifests-force. nil for a Talos plan, or when none were read.
func (o *planOptions) manifestFindings(ctx context.Context, kt *kubeTarget, snap *discovery.Snapshot) *checks.ManifestFindings {
	if !o.kubernetes || o.manifestsNode == "" || kt.dynamic == nil {
		return nil
	}

	f := &checks.ManifestFindings{Node: o.manifestsNode, Objects: len(o.manifests), Err: o.manifestsErr}
	if f.Err != nil {
		return f
	}

	objs, err := planManifests(snap, o.manifestsNode, o.manifests, o.target)
	if err != nil {
		f.Err = err

		return f
	}

	dry, err := kube.NewManifestApplier(kt.dynamic, kt.client.Discovery()).Check(ctx, objs, kube.SyncOptions{Force: o.ManifestsForce})
	f.Skipped, f.TakenOver, f.Err = dry.Skipped, dry.TakenOver, err

	return f
}

// planManifests are the manifests of control plane node as the run will sync them to
// target: Talos' render once its config runs kube-proxy at the target.
func planManifests(snap *discovery.Snapshot, node string, objs []*unstructured.Unstructured, target stages.Version) ([]*unstructured.Unstructured, error) {
	for _, n := range snap.Nodes {
		if n.Name == node && n.Talos != nil {
			return stages.ManifestsAtTarget(objs, n, n.Talos.Config, target)
		}
	}

	return nil, fmt.Errorf("node %q: no machine config read to render its manifests for %s", node, target)
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

	return o.finish(ctx, plan, kube, snap, checks.Kubernetes())
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

	return o.validateInstallers(o.target)
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

	return o.finish(ctx, plan, kube, snap, checks.Talos())
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
