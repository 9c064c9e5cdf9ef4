package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// LogsOptions are the options of `kubectl ichor logs`.
type LogsOptions struct {
	genericiooptions.IOStreams

	f *factory

	// Follow is -f: stream the runner's log, from one pod to the next, until the
	// operation ends or pauses.
	Follow bool
}

// Complete fills the options from the command line.
func (o *LogsOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.f = f

	return nil
}

// Validate checks the options.
func (o *LogsOptions) Validate() error { return nil }

// Run prints the logs of the operation's runner pods, oldest first, through the API.
func (o *LogsOptions) Run(ctx context.Context) error {
	ctl, err := o.f.Control()
	if err != nil {
		return err
	}

	op, err := ctl.Get(ctx)
	if err != nil {
		return err
	}

	pods, err := ctl.Pods(ctx, op.Spec.ID)
	if err != nil {
		return err
	}

	if !o.Follow {
		if len(pods) == 0 {
			writef(o.ErrOut, "no runner pod of operation %s is left (job %s)\n", op.Spec.ID, op.Status.Job)

			return nil
		}

		for _, p := range pods {
			if len(pods) > 1 {
				writef(o.Out, "==> pod %s (node %s, %s) <==\n", p.Name, p.Spec.NodeName, p.Status.Phase)
			}

			if err := o.stream(ctx, ctl, p.Name, false); err != nil {
				writef(o.ErrOut, "pod %s: %v\n", p.Name, err)
			}
		}

		return nil
	}

	return o.follow(ctx, ctl, op.Spec.ID, pods)
}

// follow streams every runner pod's log, oldest first, then waits for the next pod
// until the operation no longer runs.
func (o *LogsOptions) follow(ctx context.Context, ctl *job.Control, id string, pods []corev1.Pod) error {
	done := map[string]bool{}

	for {
		for _, p := range pods {
			if done[p.Name] {
				continue
			}

			writef(o.Out, "==> pod %s (node %s) <==\n", p.Name, p.Spec.NodeName)

			if err := o.streamWhenStarted(ctx, ctl, p.Name); err != nil && ctx.Err() == nil {
				writef(o.ErrOut, "pod %s: %v\n", p.Name, err)
			}

			done[p.Name] = true
		}

		if ctx.Err() != nil {
			return nil
		}

		op, err := ctl.Get(ctx)
		if err != nil {
			return err
		}

		var err2 error

		pods, err2 = ctl.Pods(ctx, id)
		if err2 != nil {
			return err2
		}

		fresh := false
		for _, p := range pods {
			fresh = fresh || !done[p.Name]
		}

		if !fresh && (op.Status.Phase.Finished() || op.Status.Phase == api.PhasePaused || op.Spec.ID != id) {
			return nil
		}

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.f.deps.job.poll):
		}
	}
}

// streamWhenStarted streams a pod's log once its container started.
func (o *LogsOptions) streamWhenStarted(ctx context.Context, ctl *job.Control, pod string) error {
	for {
		err := o.stream(ctx, ctl, pod, true)
		if err == nil || ctx.Err() != nil {
			return nil
		}

		p, gerr := ctl.Kube.CoreV1().Pods(ctl.Namespace).Get(ctx, pod, metav1.GetOptions{})
		if gerr != nil || p.Status.Phase != corev1.PodPending {
			return err
		}

		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.f.deps.job.poll):
		}
	}
}

func (o *LogsOptions) stream(ctx context.Context, ctl *job.Control, pod string, follow bool) error {
	req := ctl.Kube.CoreV1().Pods(ctl.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: job.ContainerName, Follow: follow})

	rc, err := req.Stream(ctx)
	if err != nil {
		return fmt.Errorf("logs: %w", err)
	}

	defer rc.Close() //nolint:errcheck

	if _, err := io.Copy(o.Out, rc); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("logs: %w", err)
	}

	return nil
}

func newLogsCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &LogsOptions{IOStreams: streams}

	cmd := &cobra.Command{
		Use:   "logs",
		Short: "Print the log of the upgrade Job's runner, every pod of it in turn",
		Example: `  kubectl ichor logs
  kubectl ichor logs -f`,
		Args: cobra.NoArgs,
		RunE: runCommand(f, o),
	}

	cmd.Flags().BoolVarP(&o.Follow, "follow", "f", false, "Stream the log, from pod to pod, until the operation ends or pauses")

	return cmd
}
