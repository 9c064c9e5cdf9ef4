package plugin

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

// UpgradeClusterOptions are the options of `kubectl ichor upgrade cluster`: the upgrade
// path to a Talos and/or a Kubernetes target, run as one operation by the Job.
type UpgradeClusterOptions struct {
	upgradeOptions
	pathOptions
}

// Complete fills the options from the command line.
func (o *UpgradeClusterOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.use(f)

	return o.completePath()
}

// Validate checks the options.
func (o *UpgradeClusterOptions) Validate() error {
	if err := o.upgradeOptions.validate(); err != nil {
		return err
	}

	return o.pathOptions.validate()
}

// Run plans the path and its first hop as `plan cluster` does, prints it, confirms,
// launches the Job that runs every hop and follows it.
func (o *UpgradeClusterOptions) Run(ctx context.Context) error {
	defer o.printStats()

	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	if err := ctl.CheckFree(ctx); err != nil {
		return err
	}

	doc, cluster, err := o.show(ctx, &o.planOptions)
	if err != nil {
		return err
	}

	if len(doc.Hops) == 0 {
		writef(o.Out, "\nNothing to do: the cluster runs the targets already.\n")

		return nil
	}

	l, err := pathLaunch(doc, cluster, o.hopInstallers)
	if err != nil {
		return err
	}

	return o.launch(ctx, ctl, l)
}

// pathLaunch is the launch of the path doc plans: its hops, and the document with hop
// 1's plan without its drain preview (as a plain upgrade's).
func pathLaunch(doc *api.UpgradePath, cluster string, installersFor func(stages.Version) (stages.InstallerFlags, error)) (launching, error) {
	forJob := *doc
	forJob.Hops = append([]api.Hop(nil), doc.Hops...)

	if p := forJob.Hops[0].Plan; p != nil {
		first := *p
		first.Drains = nil
		forJob.Hops[0].Plan = &first
	}

	hops := make([]api.HopSpec, len(doc.Hops))
	labels := make([]string, len(doc.Hops))

	for i, h := range doc.Hops {
		hops[i] = api.HopSpec{Upgrade: h.Upgrade, To: h.To, Source: h.Source}
		labels[i] = hops[i].Label()

		if h.Upgrade != api.UpgradeTalos {
			continue
		}

		to, err := stages.ParseVersion(h.To)
		if err != nil {
			return launching{}, err
		}

		installers, err := installersFor(to)
		if err != nil {
			return launching{}, err
		}

		hops[i].Installers = api.Installers(installers)
	}

	var targets []string

	if t := doc.Targets.Talos; t != "" {
		targets = append(targets, api.UpgradeTalos+" "+t)
	}

	if k := doc.Targets.Kubernetes; k != "" {
		targets = append(targets, api.UpgradeKubernetes+" "+k)
	}

	return launching{
		upgrade: api.UpgradeCluster, target: strings.Join(targets, ", "), hops: hops, document: &forJob,
		question: fmt.Sprintf("Upgrade cluster %q along the path of %d hops (%s)", cluster, len(hops), strings.Join(labels, ", ")),
	}, nil
}

func newUpgradeClusterCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &UpgradeClusterOptions{upgradeOptions: upgradeOptions{planOptions: planOptions{IOStreams: streams}}}

	cmd := &cobra.Command{
		Use:   "cluster [--talos vA.B.C] [--kubernetes vX.Y.Z]",
		Short: "Upgrade along the path to a Talos and/or Kubernetes target, every hop in one operation run by a Job",
		Long: `Plan the path as 'kubectl ichor plan cluster' does, confirm, then run every hop in order as one
operation: each hop is an ordinary Kubernetes (one minor) or Talos upgrade, legal when it starts.
A replaced runner continues at the hop and node it was at; a hop that pauses pauses the path.`,
		Example: `  kubectl ichor upgrade cluster --talos v1.14.1 --kubernetes v1.37.2
  kubectl ichor upgrade cluster --kubernetes v1.37.2 --via v1.35.4,v1.36.3 --pause-between-hops`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	o.pathOptions.addFlags(cmd)
	cmd.Flags().IntVar(&o.MaxUnavailable, "max-unavailable", 1, "How many workers are upgraded at once")
	cmd.Flags().BoolVarP(&o.Yes, "yes", "y", false, "Do not ask for confirmation (required without a terminal)")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "Return once the Job is created; follow later with kubectl ichor status --watch")
	cmd.Flags().BoolVar(&o.PauseBetweenHops, "pause-between-hops", false,
		"Pause after every hop but the last (to check the workloads between minors); kubectl ichor resume goes on")
	cmd.Flags().StringVar(&o.Credentials, "talos-credentials", string(api.CredentialsServiceAccount),
		"Talos credentials of the Job: serviceaccount (a talos.dev ServiceAccount with role os:admin, needs kubernetesTalosAPIAccess) "+
			"or local (a copy of your talosconfig in a Secret, deleted when the operation ends)")
	cmd.Flags().StringVar(&o.JobImage, "image", version.DefaultImage(), "The kubectl-ichor image the Job runs")
	cmd.Flags().DurationVar(&o.ApplyTimeout, "apply-timeout", engine.DefaultApplyTimeout, "How long one machine config apply may take")
	cmd.Flags().DurationVar(&o.VerifyTimeout, "verify-timeout", engine.DefaultVerifyTimeout, "How long a node may take to verify after its change")
	cmd.Flags().DurationVar(&o.DrainTimeout, "drain-timeout", engine.DefaultDrainTimeout, "How long one node's drain may take")
	cmd.Flags().DurationVar(&o.UpgradeTimeout, "upgrade-timeout", engine.DefaultUpgradeTimeout, "How long one node's Talos Upgrade call may take")
	cmd.Flags().DurationVar(&o.RebootTimeout, "reboot-timeout", engine.DefaultRebootTimeout, "How long a node may take to come back after its reboot")
	cmd.Flags().DurationVar(&o.PullTimeout, "pull-timeout", engine.DefaultPullTimeout,
		"How long one node's pre-pull of a stage's images may take (each node its own bound, its images at once)")
	cmd.Flags().IntVar(&o.PullConcurrency, "pull-concurrency", engine.DefaultPullConcurrency, "How many nodes pre-pull images at once")
	o.addManifestsForceFlag(cmd)
	addEtcdFlags(cmd, &o.planOptions)
	cmd.Flags().BoolVar(&o.RequestStats, "request-stats", false, "Print the number of Kubernetes requests and Talos calls made on stderr")
	_ = cmd.Flags().MarkHidden("request-stats")
	o.readEtcd = false // read only when a Talos target is given (Run)

	return cmd
}
