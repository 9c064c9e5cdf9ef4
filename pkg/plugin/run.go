package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// Exit codes Run returns.
const (
	// ExitOK means success, warnings included.
	ExitOK = 0
	// ExitError is any error but a refusal.
	ExitError = 1
	// ExitRefused means a check refused the plan.
	ExitRefused = 2
)

// Run runs `kubectl ichor` with args (without the program name) and returns the exit code.
// Errors are printed once, on streams.ErrOut, as one line.
func Run(ctx context.Context, streams genericiooptions.IOStreams, args []string) int {
	return run(ctx, streams, args, defaultDeps())
}

func run(ctx context.Context, streams genericiooptions.IOStreams, args []string, deps deps) int {
	prof := &profiling{}
	root := newRootCommand(streams, deps)
	prof.addFlags(root.PersistentFlags())
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return prof.start() }
	root.SetArgs(args)

	err := errors.Join(root.ExecuteContext(ctx), prof.stop())
	if err == nil {
		return ExitOK
	}

	var exit *exitError
	if errors.As(err, &exit) && exit.silent {
		return exit.code
	}

	fmt.Fprintf(streams.ErrOut, "error: %s\n", strings.Join(strings.Fields(err.Error()), " "))

	if errors.As(err, &exit) {
		return exit.code
	}

	return ExitError
}

// exitError carries an exit code other than ExitError. A silent one was already
// explained on the streams.
type exitError struct {
	code   int
	err    error
	silent bool
}

func (e *exitError) Error() string { return e.err.Error() }

func (e *exitError) Unwrap() error { return e.err }

// globalFlags are the flags every command shares.
type globalFlags struct {
	kube  *genericclioptions.ConfigFlags
	talos TalosFlags
}

// namespace is the product's namespace: -n, not the kubeconfig context's namespace.
func (g *globalFlags) namespace() string {
	if g.kube.Namespace == nil || *g.kube.Namespace == "" {
		return job.DefaultNamespace
	}

	return *g.kube.Namespace
}

func newRootCommand(streams genericiooptions.IOStreams, deps deps) *cobra.Command {
	flags := &globalFlags{kube: genericclioptions.NewConfigFlags(true)}
	ns := job.DefaultNamespace
	flags.kube.Namespace = &ns

	root := &cobra.Command{
		Use:   "ichor",
		Short: "Upgrade Talos Linux clusters, Kubernetes and Talos OS, carefully and resumably",
		Long: `kubectl ichor plans and runs upgrades of Talos Linux clusters.

  kubectl ichor plan kubernetes --to v1.37.2      # read-only: discovery, checks, the staged plan
  kubectl ichor upgrade kubernetes --to v1.37.2   # the plan, a confirmation, then an in-cluster Job runs it
  kubectl ichor plan talos --to v1.14.1           # the same two verbs for the Talos OS
  kubectl ichor upgrade talos --to v1.14.1
  kubectl ichor status | logs | resume | abort    # follow and steer the operation`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl ichor"},
		SilenceErrors: true,
		SilenceUsage:  true,
	}

	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)

	flags.kube.AddFlags(root.PersistentFlags())

	if f := root.PersistentFlags().Lookup("namespace"); f != nil {
		f.Usage = "The namespace kubectl-ichor works in (its Job, state and credentials)"
	}

	flags.talos.AddFlags(root.PersistentFlags())

	f := newFactory(flags, deps)

	root.AddCommand(newVersionCommand(streams, f), newPlanCommand(streams, f))
	root.AddCommand(newUpgradeCommand(streams, f), newStatusCommand(streams, f), newLogsCommand(streams, f),
		newResumeCommand(streams, f), newAbortCommand(streams, f), newRunCommand(streams, f))

	return root
}
