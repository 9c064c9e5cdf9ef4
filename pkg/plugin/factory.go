package plugin

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// factory builds the clients of one command from the global flags, kubectl's
// cmdutil.Factory in small: a command's Complete takes it, its Run asks it for what it
// needs. Each client is built once, on first use, so a command that plans and then
// launches (upgrade) reads the cluster over one Talos connection, and a flag's own error
// (a bad --to) is said before a missing kubeconfig or talosconfig. runCommand closes it
// when Run returns.
type factory struct {
	flags *globalFlags
	deps  deps

	kube    *kubeTarget
	job     *jobTarget
	control *job.Control
	talos   discovery.TalosReader
}

func newFactory(flags *globalFlags, d deps) *factory {
	return &factory{flags: flags, deps: d}
}

// Kube is the Kubernetes API the kubeconfig flags name, for reading the cluster.
func (f *factory) Kube() (*kubeTarget, error) {
	if f.kube != nil {
		return f.kube, nil
	}

	if f.deps.kube == nil {
		return nil, errors.New("no cluster connection")
	}

	t, err := f.deps.kube(f.flags.kube)
	if err != nil {
		return nil, err
	}

	f.kube = t

	return t, nil
}

// Talos is the Talos API the Talos flags name, opened once for the command's life.
func (f *factory) Talos(ctx context.Context) (discovery.TalosReader, error) {
	if f.talos != nil {
		return f.talos, nil
	}

	if f.deps.talos == nil {
		return nil, errors.New("no Talos connection")
	}

	t, err := f.deps.talos(ctx, f.flags.talos)
	if err != nil {
		return nil, err
	}

	f.talos = t

	return t, nil
}

// Control is the operation's control (launch, resume, abort, status) in the product's
// namespace, with the operator's credentials.
func (f *factory) Control() (*job.Control, error) {
	if f.control != nil {
		return f.control, nil
	}

	if f.deps.job.connect == nil {
		return nil, errors.New("no cluster connection")
	}

	t, err := f.deps.job.connect(f.flags.kube)
	if err != nil {
		return nil, err
	}

	c := &job.Control{Kube: t.kube, Dynamic: t.dynamic, Namespace: f.flags.namespace(), Now: f.deps.job.now}
	if f.deps.job.control != nil {
		f.deps.job.control(c)
	}

	f.control = c

	return c, nil
}

// InCluster is the cluster as the Job's pod reaches it (the run verb).
func (f *factory) InCluster() (*jobTarget, error) {
	if f.job != nil {
		return f.job, nil
	}

	if f.deps.job.inCluster == nil {
		return nil, errors.New("no in-cluster connection")
	}

	t, err := f.deps.job.inCluster(f.flags.kube)
	if err != nil {
		return nil, err
	}

	f.job = t

	return t, nil
}

// Close closes the Talos connection, if one was opened.
func (f *factory) Close() error {
	c, isCloser := f.talos.(io.Closer)
	f.talos = nil

	if !isCloser {
		return nil
	}

	return c.Close()
}

// options is one command's options, as kubectl writes them: Complete fills them from
// the command line and takes the factory, Validate checks them without reaching the
// cluster, Run does the work.
type options interface {
	Complete(f *factory, cmd *cobra.Command, args []string) error
	Validate() error
	Run(ctx context.Context) error
}

// runCommand is a command's RunE: Complete, Validate, Run, then the factory closed.
func runCommand(f *factory, o options) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := o.Complete(f, cmd, args); err != nil {
			return err
		}

		if err := o.Validate(); err != nil {
			return err
		}

		defer f.Close() //nolint:errcheck // a read-only connection: nothing to lose

		return o.Run(cmd.Context())
	}
}
