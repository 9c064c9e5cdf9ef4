package plugin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

// launchTimeout bounds the launch (objects, credentials, Job); Ctrl-C does not cut it
// short, so that an operation is never left half-launched.
const launchTimeout = 3 * time.Minute

func newUpgradeCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Plan, confirm, then run an upgrade in the cluster with a Job, and follow it",
		Args:  cobra.NoArgs,
	}

	cmd.AddCommand(newUpgradeKubernetesCommand(streams, f), newUpgradeTalosCommand(streams, f), newUpgradeClusterCommand(streams, f))

	return cmd
}

// upgradeOptions are the options both upgrade commands share.
type upgradeOptions struct {
	planOptions

	// Yes is --yes: do not ask for confirmation.
	Yes bool
	// Detach is --detach: return once the Job is created.
	Detach bool
	// JobImage is the runner's image (--image).
	JobImage string
	// Credentials is --talos-credentials: serviceaccount or local.
	Credentials string
	// Timeouts bound the engine's waits (0: its defaults).
	ApplyTimeout, VerifyTimeout, DrainTimeout, UpgradeTimeout, RebootTimeout time.Duration
	// PullTimeout is --pull-timeout: the bound of one node's pre-pull.
	PullTimeout time.Duration
	// PullConcurrency is --pull-concurrency: how many nodes pre-pull at once.
	PullConcurrency int
	// PauseBetweenHops is --pause-between-hops (upgrade cluster).
	PauseBetweenHops bool

	// beforeLaunch, when set, runs once the upgrade is confirmed, before anything
	// is created in the cluster; an error stops the launch.
	beforeLaunch func(ctx context.Context) error
}

func (o *upgradeOptions) addFlags(cmd *cobra.Command, example string) {
	cmd.Flags().StringVar(&o.To, "to", "", "The version to upgrade to, vX.Y.Z (required), e.g. "+example)
	cmd.Flags().IntVar(&o.MaxUnavailable, "max-unavailable", 1, "How many workers are upgraded at once")
	cmd.Flags().BoolVarP(&o.Yes, "yes", "y", false, "Do not ask for confirmation (required without a terminal)")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "Return once the Job is created; follow later with kubectl ichor status --watch")
	cmd.Flags().StringVar(&o.Credentials, "talos-credentials", string(api.CredentialsServiceAccount),
		"Talos credentials of the Job: serviceaccount (a talos.dev ServiceAccount with role os:admin, needs kubernetesTalosAPIAccess) "+
			"or local (a copy of your talosconfig in a Secret, deleted when the operation ends)")
	cmd.Flags().DurationVar(&o.VerifyTimeout, "verify-timeout", engine.DefaultVerifyTimeout, "How long a node may take to verify after its change")
	cmd.Flags().DurationVar(&o.DrainTimeout, "drain-timeout", engine.DefaultDrainTimeout, "How long one node's drain may take")
	cmd.Flags().DurationVar(&o.PullTimeout, "pull-timeout", engine.DefaultPullTimeout,
		"How long one node's pre-pull of a stage's images may take (each node its own bound, its images at once)")
	cmd.Flags().IntVar(&o.PullConcurrency, "pull-concurrency", engine.DefaultPullConcurrency, "How many nodes pre-pull images at once")
}

func (o *upgradeOptions) validate() error {
	if err := o.planOptions.validate(); err != nil {
		return err
	}

	switch api.Credentials(o.Credentials) {
	case api.CredentialsServiceAccount, api.CredentialsLocal:
	default:
		return fmt.Errorf("--talos-credentials %q: pass serviceaccount or local", o.Credentials)
	}

	if o.JobImage == "" {
		return errors.New("--image is empty: pass the kubectl-ichor image to run the Job with, e.g. " + version.DefaultImage())
	}

	for name, d := range map[string]time.Duration{"apply": o.ApplyTimeout, "verify": o.VerifyTimeout, "drain": o.DrainTimeout, "upgrade": o.UpgradeTimeout, "reboot": o.RebootTimeout} {
		if d < 0 {
			return fmt.Errorf("--%s-timeout %s: pass a positive duration", name, d)
		}
	}

	// Zero is no bound for a pull, not the default: refused like a negative one.
	if o.PullTimeout <= 0 {
		return fmt.Errorf("--pull-timeout %s: pass a positive duration, e.g. %s", o.PullTimeout, engine.DefaultPullTimeout)
	}

	if o.PullConcurrency < 1 {
		return fmt.Errorf("--pull-concurrency %d: pass how many nodes may pull at once, 1 or more (default %d)", o.PullConcurrency, engine.DefaultPullConcurrency)
	}

	return nil
}

// plan discovers the cluster, plans with makePlan, runs the checks and prints the plan; a
// refused plan is an error. It refuses at once when another operation is in progress.
func (o *upgradeOptions) plan(ctx context.Context, ctl *job.Control, makePlan func(*discovery.Snapshot) (*api.Plan, error), list []checks.Check) (*api.Plan, error) {
	if err := ctl.CheckFree(ctx); err != nil {
		return nil, err
	}

	snap, kube, err := o.discover(ctx)
	if err != nil {
		return nil, err
	}

	plan, err := makePlan(snap)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}

	if err := o.finish(ctx, plan, kube, list); err != nil {
		return nil, err
	}

	return plan, nil
}

// launching is what an upgrade command launches once its plan was printed.
type launching struct {
	// upgrade, target and hops are the operation's spec (api.OperationSpec).
	upgrade, target string
	hops            []api.HopSpec
	installers      stages.InstallerFlags
	// document is what the operator confirmed (the Plan, or the UpgradePath), kept in
	// the state.
	document any
	// question is what the confirmation asks, without its end.
	question string
}

// launchPlan is the launch of a plain upgrade of plan's kind and target. The Job needs
// the stages, not the drain preview (its size grows with the cluster's pods; the runner
// drains by the same rules anyway).
func (o *upgradeOptions) launchPlan(plan *api.Plan, installers stages.InstallerFlags) launching {
	forJob := *plan
	forJob.Drains = nil

	return launching{
		upgrade: plan.Upgrade, target: o.target.String(), installers: installers, document: &forJob,
		question: fmt.Sprintf("Upgrade %s of cluster %q to %s", kindTitle(plan.Upgrade), confirmName(plan.Cluster), plan.Target),
	}
}

// confirmName is how the confirmation names a cluster.
func confirmName(c api.Cluster) string {
	if c.Name != "" {
		return c.Name
	}

	return c.Endpoint
}

// id is a new operation ID: its kind and target; a path's is named by its last hop.
func (l launching) id() string {
	if n := len(l.hops); n > 0 {
		return job.NewOperationID("path", l.hops[n-1].To)
	}

	return job.NewOperationID(l.upgrade, l.target)
}

// launch confirms, launches the operation and follows it (unless --detach).
func (o *upgradeOptions) launch(ctx context.Context, ctl *job.Control, l launching) error {
	access := job.ManifestAccess{}
	spec := api.OperationSpec{Upgrade: l.upgrade, Target: l.target, Hops: l.hops}

	if runsKubernetes(spec) {
		var err error
		if access, err = o.f.manifestAccess(ctx); err != nil {
			return fmt.Errorf("read the bootstrap manifests through Talos (the Job may re-apply exactly their objects): %w: "+
				"check --talosconfig and --talos-endpoints", err)
		}

		for _, l := range access.Left {
			writef(o.ErrOut, "warning: the Job may not re-apply %s\n", l)
		}
	}

	ctl.Access = &access

	if !o.Yes {
		if err := o.confirm(ctx, l.question, ctl.Namespace); err != nil {
			return err
		}
	}

	if o.beforeLaunch != nil {
		if err := o.beforeLaunch(ctx); err != nil {
			return err
		}
	}

	creds := api.Credentials(o.Credentials)

	var talosconfig []byte

	if creds == api.CredentialsLocal {
		var err error
		if talosconfig, err = localTalosconfig(o.f.flags.talos); err != nil {
			return err
		}

		writef(o.ErrOut, "warning: --talos-credentials=local copies your talosconfig (its client certificate and key) into secret %s/%s; "+
			"it is deleted when the operation ends\n", ctl.Namespace, job.LocalTalosconfigName)
	}

	planJSON, err := json.Marshal(l.document)
	if err != nil {
		return fmt.Errorf("encode plan: %w", err)
	}

	spec = api.OperationSpec{
		ID:               l.id(),
		Upgrade:          l.upgrade,
		Target:           l.target,
		Hops:             l.hops,
		PauseBetweenHops: o.PauseBetweenHops,
		Installers:       api.Installers(l.installers),
		MaxUnavailable:   o.MaxUnavailable,
		PullConcurrency:  o.PullConcurrency,
		AllowEtcdOutage:  o.AllowEtcdOutage,
		ManifestsForce:   o.ManifestsForce,
		Image:            o.JobImage,
		Credentials:      creds,
		Timeouts: api.Timeouts{
			Apply: api.NewTimeout(o.ApplyTimeout), Verify: api.NewTimeout(o.VerifyTimeout), Drain: api.NewTimeout(o.DrainTimeout),
			Upgrade: api.NewTimeout(o.UpgradeTimeout), Reboot: api.NewTimeout(o.RebootTimeout), Pull: api.NewTimeout(o.PullTimeout),
		},
		CreatedBy: "kubectl-ichor " + version.Version,
	}

	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), launchTimeout)
	defer cancel()

	req := job.LaunchRequest{Spec: spec, Plan: planJSON, Talosconfig: talosconfig}
	if o.cluster != nil {
		// The plan's look at etcd serves as the first pass of the runner's first
		// read, when the runner starts soon enough.
		req.Memo = engine.EtcdPassMemo(o.cluster.EtcdPasses)
	}

	op, err := ctl.Launch(lctx, req)
	if err != nil {
		return err
	}

	writef(o.Out, "\nLaunched operation %s: job %s/%s runs %s\n", op.Spec.ID, ctl.Namespace, op.Status.Job, op.Spec.Image)

	n := nsFlag(ctl.Namespace)

	if o.Detach {
		writef(o.Out, "Follow it with: kubectl ichor status --watch%s (logs: kubectl ichor logs -f%s)\n", n, n)

		return nil
	}

	live := o.f.deps.job.terminal(o.Out)
	if live {
		writef(o.Out, "Ctrl-C detaches: the upgrade goes on in the cluster.\n\n")
	}

	f := &follower{IOStreams: o.IOStreams, ctl: ctl, live: live, poll: o.f.deps.job.poll, now: o.f.deps.job.now}

	return f.run(ctx)
}

// confirm asks on the terminal; without one it refuses (--yes). Ctrl-C (ctx) is a no.
func (o *upgradeOptions) confirm(ctx context.Context, question, namespace string) error {
	if !o.f.deps.job.terminal(o.In) {
		return errors.New("no terminal to confirm on: pass --yes to upgrade without confirmation")
	}

	writef(o.Out, "\n%s, run by a Job in namespace %s? [y/N]: ", question, namespace)

	answers := make(chan string, 1)

	go func() {
		answer, _ := bufio.NewReader(o.In).ReadString('\n')
		answers <- answer
	}()

	select {
	case answer := <-answers:
		switch strings.ToLower(strings.TrimSpace(answer)) {
		case "y", "yes":
			return nil
		}
	case <-ctx.Done():
		writef(o.Out, "\n")
	}

	return errors.New("not confirmed: nothing was changed")
}

// localTalosconfig is the operator's talosconfig reduced to the context in use (and its
// endpoints as the flags say), for --talos-credentials=local.
func localTalosconfig(flags TalosFlags) ([]byte, error) {
	path, err := talos.FindConfig(flags.ConfigPath)
	if err != nil {
		return nil, err
	}

	cfg, err := clientconfig.Open(path)
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s: %w", path, err)
	}

	name := flags.Context
	if name == "" {
		name = cfg.Context
	}

	c, found := cfg.Contexts[name]
	if !found {
		return nil, fmt.Errorf("talosconfig %s has no context %q: pass --talos-context", path, name)
	}

	if len(flags.Endpoints) > 0 {
		c.Endpoints = flags.Endpoints
	}

	out, err := (&clientconfig.Config{Context: name, Contexts: map[string]*clientconfig.Context{name: c}}).Bytes()
	if err != nil {
		return nil, fmt.Errorf("talosconfig %s: %w", path, err)
	}

	return out, nil
}

// UpgradeKubernetesOptions are the options of `kubectl ichor upgrade kubernetes`.
type UpgradeKubernetesOptions struct {
	upgradeOptions
}

// Complete fills the options from the command line.
func (o *UpgradeKubernetesOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	return o.complete(f)
}

// Validate checks the options.
func (o *UpgradeKubernetesOptions) Validate() error { return o.validate() }

// Run plans, confirms, launches the Job and follows it.
func (o *UpgradeKubernetesOptions) Run(ctx context.Context) error {
	defer o.printStats()

	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	plan, err := o.plan(ctx, ctl, func(snap *discovery.Snapshot) (*api.Plan, error) {
		return stages.PlanKubernetes(snap, o.target, stages.Options{MaxUnavailable: o.MaxUnavailable})
	}, checks.Kubernetes())
	if err != nil {
		return err
	}

	return o.launch(ctx, ctl, o.launchPlan(plan, stages.InstallerFlags{}))
}

func newUpgradeKubernetesCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &UpgradeKubernetesOptions{upgradeOptions{planOptions: planOptions{IOStreams: streams, kubernetes: true}}}

	cmd := &cobra.Command{
		Use:   "kubernetes --to vX.Y.Z",
		Short: "Upgrade Kubernetes in four stages, run by a Job in the cluster",
		Example: `  kubectl ichor upgrade kubernetes --to v1.37.2
  kubectl ichor upgrade kubernetes --to v1.37.2 --yes --detach
  kubectl ichor upgrade kubernetes --to v1.37.2 --talos-credentials=local`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.addFlags(cmd, "v1.37.2")
	cmd.Flags().StringVar(&o.JobImage, "image", version.DefaultImage(), "The kubectl-ichor image the Job runs")
	o.addManifestsForceFlag(cmd)
	cmd.Flags().DurationVar(&o.ApplyTimeout, "apply-timeout", engine.DefaultApplyTimeout, "How long one machine config apply may take")

	return cmd
}

// UpgradeTalosOptions are the options of `kubectl ichor upgrade talos`.
type UpgradeTalosOptions struct {
	upgradeOptions
	installerOptions

	// EtcdSnapshot is --etcd-snapshot: the file to save an etcd snapshot to before
	// the Job is launched ("": none).
	EtcdSnapshot string
}

// Complete fills the options from the command line.
func (o *UpgradeTalosOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	return o.complete(f)
}

// Validate checks the options.
func (o *UpgradeTalosOptions) Validate() error {
	if err := o.validate(); err != nil {
		return err
	}

	if err := o.validateInstallers(o.target, "--to"); err != nil {
		return err
	}

	if stages.IsInstallerImage(o.JobImage) {
		return fmt.Errorf("--image %q is a Talos installer: --image is the kubectl-ichor image the Job runs; pass the installer with --installer-image", o.JobImage)
	}

	if o.EtcdSnapshot != "" {
		return checkSnapshotPath(o.EtcdSnapshot)
	}

	return nil
}

// saveEtcdSnapshot saves --etcd-snapshot through Talos, from a control plane
// whose etcd member the plan found healthy, and says where, how big and its
// sha256.
func (o *UpgradeTalosOptions) saveEtcdSnapshot(ctx context.Context) error {
	tc, err := o.f.Talos(ctx)
	if err != nil {
		return err
	}

	s, ok := tc.(etcdSnapshotter)
	if !ok {
		return errors.New("--etcd-snapshot: this Talos client cannot take an etcd snapshot")
	}

	writef(o.Out, "Saving an etcd snapshot to %s ...\n", o.EtcdSnapshot)

	saved, err := saveEtcdSnapshot(ctx, s, o.cluster.Etcd, o.EtcdSnapshot)
	if err != nil {
		return fmt.Errorf("%w: nothing was launched; take one with talosctl -n <control plane> etcd snapshot <file>, or run without --etcd-snapshot", err)
	}

	writef(o.Out, "Saved the etcd snapshot of %s to %s: %d bytes, sha256 %s\n", saved.Node, o.EtcdSnapshot, saved.Size, saved.SHA256)

	return nil
}

// Run plans, confirms, launches the Job and follows it.
func (o *UpgradeTalosOptions) Run(ctx context.Context) error {
	defer o.printStats()

	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	o.installed = true
	o.staged = true

	if o.EtcdSnapshot != "" {
		o.beforeLaunch = o.saveEtcdSnapshot
	}

	plan, err := o.plan(ctx, ctl, func(snap *discovery.Snapshot) (*api.Plan, error) {
		return stages.PlanTalos(snap, o.target, o.installers, stages.Options{MaxUnavailable: o.MaxUnavailable})
	}, checks.Talos())
	if err != nil {
		return err
	}

	return o.launch(ctx, ctl, o.launchPlan(plan, o.installers))
}

func newUpgradeTalosCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &UpgradeTalosOptions{upgradeOptions: upgradeOptions{planOptions: planOptions{IOStreams: streams}}}

	cmd := &cobra.Command{
		Use:   "talos --to vA.B.C",
		Short: "Upgrade the Talos OS node by node, run by a Job in the cluster",
		Example: `  kubectl ichor upgrade talos --to v1.14.1
  kubectl ichor upgrade talos --to v1.14.1 --installer-image worker-1=factory.talos.dev/metal-installer/<schematic>:v1.14.1 --yes`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.addFlags(cmd, "v1.14.1")
	o.addInstallerFlags(cmd.Flags())
	cmd.Flags().StringVar(&o.JobImage, "image", version.DefaultImage(), "The kubectl-ichor image the Job runs")
	cmd.Flags().DurationVar(&o.UpgradeTimeout, "upgrade-timeout", engine.DefaultUpgradeTimeout, "How long one node's Talos Upgrade call may take")
	cmd.Flags().DurationVar(&o.RebootTimeout, "reboot-timeout", engine.DefaultRebootTimeout, "How long a node may take to come back after its reboot")
	addEtcdFlags(cmd, &o.planOptions)
	cmd.Flags().StringVar(&o.EtcdSnapshot, "etcd-snapshot", "",
		"Save an etcd snapshot through Talos to this new FILE before the Job is launched (written whole or not at all; never overwrites)")

	return cmd
}
