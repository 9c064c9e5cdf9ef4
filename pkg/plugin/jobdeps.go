package plugin

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Exit codes of the commands that follow an operation.
const (
	// ExitPaused means the operation paused: `kubectl ichor resume` continues it.
	ExitPaused = job.ExitPaused
	// ExitDetached means Ctrl-C detached from an operation that goes on in the cluster.
	ExitDetached = 130
)

// jobDeps are what the commands of an operation need; tests replace them.
type jobDeps struct {
	// connect reaches the cluster with the operator's credentials.
	connect func(flags *genericclioptions.ConfigFlags) (*jobTarget, error)
	// inCluster reaches the cluster from the Job's pod (the `run` verb).
	inCluster func(flags *genericclioptions.ConfigFlags) (*jobTarget, error)
	// engine builds the upgrade engine of the `run` verb.
	engine job.EngineFactory
	// terminal reports whether a stream is a terminal.
	terminal func(stream any) bool
	// now is the clock.
	now func() time.Time
	// poll is how often following looks at the state again.
	poll time.Duration
	// env reads the environment (the `run` verb's POD_NAME, NODE_NAME, POD_NAMESPACE).
	env func(name string) string
	// talosconfig finds the talosconfig the `run` verb uses (talos.FindConfig).
	talosconfig func(explicit string) (string, error)
	// control tunes the job.Control the commands build (tests shorten its waits).
	control func(c *job.Control)
}

// jobTarget is a connected cluster for the commands of an operation.
type jobTarget struct {
	kube    kubernetes.Interface
	dynamic dynamic.Interface
	// lock is the runner's client of the lock (job.LockClientConfig).
	lock kubernetes.Interface
}

func defaultJobDeps() jobDeps {
	return jobDeps{
		connect:   connectJob,
		inCluster: connectInCluster,
		engine:    job.NewStagesEngine,
		terminal:  isTerminal,
		now:       time.Now,
		poll:      time.Second,
		env:       os.Getenv,

		talosconfig: talos.FindConfig,
	}
}

func connectJob(flags *genericclioptions.ConfigFlags) (*jobTarget, error) {
	cfg, err := restConfigOf(flags)
	if err != nil {
		return nil, err
	}

	return newJobTarget(cfg)
}

// connectInCluster uses the pod's ServiceAccount, or the kubeconfig when one is named
// (to run the runner by hand).
func connectInCluster(flags *genericclioptions.ConfigFlags) (*jobTarget, error) {
	if flags.KubeConfig != nil && *flags.KubeConfig != "" {
		return connectJob(flags)
	}

	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config: %w: the run verb runs in the upgrade Job's pod (or pass --kubeconfig)", err)
	}

	if flags.WrapConfigFn != nil {
		cfg = flags.WrapConfigFn(cfg)
	}

	// The runner lives through the apiserver restarts it causes, each a
	// moment of 403s (see kube.RetryForbidden); the plugin's commands answer
	// a denial at once.
	cfg.Wrap(kube.RetryForbidden)

	return newJobTarget(withRates(cfg))
}

// withRates is cfg with the client-side rate limit kubectl gives its discovery client
// (50 a second, burst 300) instead of client-go's 5 (burst 10), which the apiserver's
// own priority and fairness makes needless. The runner's engine shares them with its
// state writes and events: at 20 a second (burst 40), a batch of workers stepping
// together queued the engine's own reads behind those; at 5, plan's dry run of the
// bootstrap manifests alone waited two seconds.
func withRates(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 50, 300

	return cfg
}

func newJobTarget(cfg *rest.Config) (*jobTarget, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}

	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}

	lock, err := kubernetes.NewForConfig(job.LockClientConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", cfg.Host, err)
	}

	return &jobTarget{kube: kube, dynamic: dyn, lock: lock}, nil
}

func isTerminal(stream any) bool {
	f, ok := stream.(interface{ Fd() uintptr })

	return ok && term.IsTerminal(int(f.Fd()))
}

// nsFlag is the -n flag naming namespace in a suggested command, "" for the default.
func nsFlag(namespace string) string {
	if namespace == job.DefaultNamespace {
		return ""
	}

	return " -n " + namespace
}

// writef writes to w, ignoring errors (the streams of a terminal).
func writef(w io.Writer, format string, args ...any) {
	_, _ = fmt.Fprintf(w, format, args...)
}
