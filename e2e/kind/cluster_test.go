package kind

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kind/pkg/apis/config/v1alpha4"
	"sigs.k8s.io/kind/pkg/cluster"
	"sigs.k8s.io/kind/pkg/cmd"
	kindexec "sigs.k8s.io/kind/pkg/exec"

	"github.com/ichor-dev/kubectl-ichor/e2e/kind/talosnode"
)

// env is the cluster every test runs against.
var env struct {
	name                   string
	kubeconfig             string
	config                 *rest.Config
	client                 kubernetes.Interface
	provider               *cluster.Provider
	controlPlanes, workers int
	// talos makes the kind nodes Talos nodes; talosconfig is its admin
	// talosconfig.
	talos       *talosnode.Cluster
	talosconfig string
	artifacts   string
	// versions are the Kubernetes versions the node image carries, the one
	// the cluster runs first.
	versions []string
	// coreDNSImage is the CoreDNS image the node image carries.
	coreDNSImage string
}

// kubeletCgroupV1 lets Kubernetes >= 1.35 run on a cgroup v1 host.
const kubeletCgroupV1 = `kind: KubeletConfiguration
apiVersion: kubelet.config.k8s.io/v1beta1
failCgroupV1: false
`

// noAddons keeps kubeadm from installing kube-proxy and CoreDNS: on Talos
// they come from the bootstrap manifests, which talosnode applies. The patch
// replaces kind's list rather than merging with it, so it keeps kind's own
// entries (preflight, and addon/kube-proxy for kubeProxyMode none).
const noAddons = `kind: InitConfiguration
skipPhases:
- preflight
- addon/kube-proxy
- addon/coredns
`

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) (code int) {
	image := os.Getenv("ICHOR_KIND_IMAGE")
	artifacts := os.Getenv("ICHOR_KIND_ARTIFACTS")
	if image == "" || artifacts == "" {
		fmt.Fprintln(os.Stderr, "kind e2e: set ICHOR_KIND_IMAGE (a node image, see make kind-image) and ICHOR_KIND_ARTIFACTS (a directory for logs), or run make kind-e2e")
		return 2
	}
	cps, workers, err := topology(os.Getenv("ICHOR_KIND_NODES"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e:", err)
		return 2
	}
	env.controlPlanes, env.workers = cps, workers
	env.name = "ichor-e2e-" + strconv.Itoa(os.Getpid())
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e:", err)
		return 1
	}
	env.kubeconfig = filepath.Join(artifacts, "kubeconfig")
	// kind writes ~/.kube/config unless told otherwise; also for its own
	// kubectl-free calls.
	os.Setenv("KUBECONFIG", env.kubeconfig)
	// kind passes this through to its nodes; unset, its entrypoint sees the
	// host's fuse-overlayfs root and picks a snapshotter the node lacks.
	if os.Getenv("KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER") == "" {
		os.Setenv("KIND_EXPERIMENTAL_CONTAINERD_SNAPSHOTTER", "overlayfs")
	}
	if err := dockerWorkaround(image, artifacts); err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e:", err)
		return 1
	}
	env.provider = cluster.NewProvider(cluster.ProviderWithDocker(), cluster.ProviderWithLogger(cmd.NewLogger()))

	// Delete the cluster whatever happens: on return, and on Ctrl-C (the
	// deletion makes a creation in progress fail, and the process exits).
	var once sync.Once
	logs := filepath.Join(artifacts, "logs")
	cleanup := func() {
		once.Do(func() {
			if err := env.provider.CollectLogs(env.name, logs); err != nil {
				fmt.Fprintln(os.Stderr, "kind e2e: collecting logs:", err)
			}
			if err := env.provider.Delete(env.name, env.kubeconfig); err != nil {
				fmt.Fprintln(os.Stderr, "kind e2e: deleting the cluster:", err)
			}
			fmt.Fprintf(os.Stderr, "kind e2e: cluster %s deleted; logs in %s\n", env.name, artifacts)
		})
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "kind e2e: %v: deleting the cluster\n", s)
		cleanup()
		os.Exit(130)
	}()
	defer cleanup()

	env.artifacts = artifacts
	cfg := &v1alpha4.Cluster{
		KubeadmConfigPatches: []string{kubeletCgroupV1, noAddons},
		Networking:           v1alpha4.Networking{KubeProxyMode: v1alpha4.ProxyMode("none")},
	}
	for range cps {
		cfg.Nodes = append(cfg.Nodes, v1alpha4.Node{Role: v1alpha4.ControlPlaneRole})
	}
	for range workers {
		cfg.Nodes = append(cfg.Nodes, v1alpha4.Node{Role: v1alpha4.WorkerRole})
	}
	start := time.Now()
	fmt.Fprintf(os.Stderr, "kind e2e: creating cluster %s (%d control planes, %d workers) from %s\n", env.name, cps, workers, image)
	if err := env.provider.Create(env.name,
		cluster.CreateWithV1Alpha4Config(cfg),
		cluster.CreateWithNodeImage(image),
		cluster.CreateWithKubeconfigPath(env.kubeconfig),
		// Nodes are Ready only once kube-proxy runs (the CNI daemon
		// reaches the apiserver through its Service): after talosnode.
		cluster.CreateWithWaitForReady(0),
		cluster.CreateWithDisplayUsage(false),
		cluster.CreateWithDisplaySalutation(false),
	); err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e: creating the cluster:", err)
		if runErr := kindexec.RunErrorForError(err); runErr != nil {
			fmt.Fprintf(os.Stderr, "kind e2e: output of the failed command:\n%s\n", runErr.Output)
		}
		return 1
	}
	fmt.Fprintf(os.Stderr, "kind e2e: cluster up in %s\n", time.Since(start).Round(time.Second))
	env.config, err = clientcmd.BuildConfigFromFlags("", env.kubeconfig)
	if err == nil {
		env.client, err = kubernetes.NewForConfig(env.config)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e:", err)
		return 1
	}
	start = time.Now()
	if err := startTalos(); err != nil {
		fmt.Fprintln(os.Stderr, "kind e2e: Talos on the kind nodes:", err)
		return 1
	}
	defer env.talos.Stop()
	fmt.Fprintf(os.Stderr, "kind e2e: Talos %s on the nodes, Kubernetes %s, cluster Ready in %s; talosconfig %s\n",
		talosVersion(), env.versions[0], time.Since(start).Round(time.Second), env.talosconfig)
	return m.Run()
}

// topology parses ICHOR_KIND_NODES, "<control planes>+<workers>" (default 3+2).
func topology(s string) (cps, workers int, err error) {
	if s == "" {
		s = "3+2"
	}
	a, b, ok := strings.Cut(s, "+")
	cps, err1 := strconv.Atoi(a)
	workers, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || cps < 1 || workers < 0 {
		return 0, 0, fmt.Errorf("ICHOR_KIND_NODES=%q: want <control planes>+<workers>, e.g. 3+2", s)
	}
	return cps, workers, nil
}

// dockerWorkaround puts a docker wrapper first on PATH when this host's
// Docker cannot start --privileged containers (Docker 20.10 asks for every
// capability the kernel knows, and the bounding set here lacks
// CAP_SYS_RESOURCE). The wrapper gives kind's nodes every capability but
// that one, and the device and security settings --privileged would, and
// drops --privileged from docker exec (the node's capabilities apply). It
// is used only when a --privileged test container fails.
func dockerWorkaround(image, artifacts string) error {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return fmt.Errorf("kind needs docker on PATH: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, docker, "run", "--rm", "--privileged", "--entrypoint", "/bin/true", image).CombinedOutput()
	if err == nil {
		return nil
	}
	if !strings.Contains(string(out), "operation not permitted") {
		return fmt.Errorf("docker run --privileged %s: %v: %s", image, err, strings.TrimSpace(string(out)))
	}
	dir := filepath.Join(artifacts, "docker-wrapper")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	script := fmt.Sprintf(wrapper, docker)
	if err := os.WriteFile(filepath.Join(dir, "docker"), []byte(script), 0o755); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kind e2e: this Docker cannot run --privileged containers; kind uses %s\n", filepath.Join(dir, "docker"))
	return os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

const wrapper = `#!/usr/bin/env bash
# Written by the kind e2e: kind's docker calls with --privileged replaced
# (this host's Docker cannot grant CAP_SYS_RESOURCE).
real=%q
args=()
sub=""
for a in "$@"; do
  if [ -z "$sub" ] && [ "${a#-}" = "$a" ]; then sub=$a; fi
  if [ "$a" = --privileged ]; then
    case $sub in
      run|create)
        args+=(--cap-add ALL --cap-drop SYS_RESOURCE
          --security-opt seccomp=unconfined --security-opt apparmor=unconfined
          --security-opt systempaths=unconfined --device-cgroup-rule 'a *:* rwm'
          --device /dev/kmsg --device /dev/fuse)
        ;;
    esac
    continue
  fi
  args+=("$a")
done
exec "$real" "${args[@]}"
`
