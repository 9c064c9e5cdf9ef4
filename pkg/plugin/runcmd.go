package plugin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// RunOptions are the options of the hidden `kubectl-ichor run`, the body of the upgrade
// Job's pod.
type RunOptions struct {
	genericiooptions.IOStreams

	f *factory

	// Operation is --operation, the ID of the operation to run.
	Operation string
}

// Complete fills the options from the command line.
func (o *RunOptions) Complete(f *factory, _ *cobra.Command, _ []string) error {
	o.f = f

	return nil
}

// Validate checks the options.
func (o *RunOptions) Validate() error {
	if o.Operation == "" {
		return &exitError{code: job.ExitFinal, err: errors.New("--operation is required: the run verb runs in the upgrade Job, started by kubectl ichor upgrade")}
	}

	return nil
}

// Run runs the operation in the cluster: it exits 0 once it succeeded, job.ExitPaused when
// it paused, job.ExitFinal when it must not run again, and otherwise non-zero for the Job
// to start another pod.
//
// Its last log lines count the requests it made to the Kubernetes and Talos APIs, in the
// form of plan's --request-stats ("request stats: kubernetes N requests (...)"), so that
// the cost of an upgrade per node can be read from the log, and give its own peak
// resident memory ("memory: peak resident N MiB (VmHWM)"), to size the Job's pod by.
func (o *RunOptions) Run(ctx context.Context) error {
	stats := newRequestStats()
	stats.byResource = true
	o.f.flags.kube.WrapConfigFn = stats.wrapKube

	t, err := o.f.InCluster()
	if err != nil {
		return err
	}

	identity := o.f.deps.job.env("POD_NAME")
	if identity == "" {
		identity, _ = os.Hostname()
	}

	out := &stampWriter{w: o.Out, now: o.f.deps.job.now}

	// The Job mounts the Talos credentials from an optional Secret, which the
	// operation's end deletes: a pod started without them is told so.
	var noTalosconfig *talos.NoTalosconfigError
	_, err = o.f.deps.job.talosconfig(o.f.flags.talos.ConfigPath)
	noCredentials := errors.As(err, &noTalosconfig)

	r := &job.Runner{
		Kube: t.kube, Dynamic: t.dynamic, LockKube: t.lock,
		Namespace: o.f.flags.namespace(), Operation: o.Operation,
		Identity: identity, Node: o.f.deps.job.env("NODE_NAME"),
		StayOnNode: o.f.deps.job.env(job.StayOnNodeEnv) == "true", NoCredentials: noCredentials,
		NewEngine: o.f.deps.job.engine, Out: out, Now: o.f.deps.job.now,
		Talos: talos.Options{
			ConfigPath: o.f.flags.talos.ConfigPath, Context: o.f.flags.talos.Context, Endpoints: o.f.flags.talos.Endpoints,
			DialOptions: stats.talosDialOptions(),
		},
	}

	err = r.Run(ctx)
	stats.print(out)

	if kib, ok := peakRSS(); ok {
		writef(out, "memory: peak resident %.1f MiB (VmHWM)\n", float64(kib)/1024)
	}

	var exit *job.ExitError

	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.Code == 0:
		writef(out, "%v\n", err)

		return nil
	case errors.As(err, &exit):
		return &exitError{code: exit.Code, err: err}
	}

	return err
}

func newRunCommand(streams genericiooptions.IOStreams, f *factory) *cobra.Command {
	o := &RunOptions{IOStreams: streams}

	cmd := &cobra.Command{
		Use:    "run --operation ID",
		Short:  "Run an upgrade operation: the body of the upgrade Job (not for people)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   runCommand(f, o),
	}

	cmd.Flags().StringVar(&o.Operation, "operation", "", "The ID of the operation to run")

	return cmd
}

// stampWriter prefixes every line with the time, for the runner's log.
type stampWriter struct {
	w   io.Writer
	now func() time.Time

	mu  sync.Mutex
	buf []byte
}

func (s *stampWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	s.buf = append(s.buf, p...)

	for {
		i := bytes.IndexByte(s.buf, '\n')
		if i < 0 {
			return len(p), nil
		}

		line := s.buf[:i+1]
		if _, err := io.WriteString(s.w, s.now().UTC().Format("15:04:05 ")+string(line)); err != nil {
			return len(p), err
		}

		s.buf = s.buf[i+1:]
	}
}

// peakRSS is the process's own peak resident memory in KiB (VmHWM in /proc/self/status,
// Linux only). Not getrusage's ru_maxrss: that also counts the memory of the process
// that started this one when it was started with vfork (Go's os/exec does), which is
// how a container runtime, or the local cluster's kubelet, may start it.
func peakRSS() (int64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}

	return vmHWM(b)
}

// vmHWM reads the VmHWM line ("VmHWM:    92768 kB") of a /proc/<pid>/status.
func vmHWM(status []byte) (int64, bool) {
	for line := range bytes.Lines(status) {
		rest, ok := bytes.CutPrefix(line, []byte("VmHWM:"))
		if !ok {
			continue
		}

		var kib int64
		if _, err := fmt.Sscanf(string(rest), "%d kB", &kib); err != nil {
			return 0, false
		}

		return kib, true
	}

	return 0, false
}
