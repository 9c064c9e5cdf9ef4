//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
)

// TestSimulatedCluster starts a 3+2 cluster and checks what the product
// relies on: Nodes and mirror pods as kubectl shows them, the events log,
// the Talos API over mTLS with node routing, a NO_REBOOT apply that restarts
// a static pod, a kubelet restart, and a pod run as a process with the
// in-cluster Kubernetes and Talos credentials.
func TestSimulatedCluster(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "3", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.13.9",
		"--image", "ichor.test/podcheck="+buildPodcheck(t))
	ctx := context.Background()

	t.Run("kubectl sees Ready nodes and mirror pods", func(t *testing.T) {
		out, err := c.kubectl(t, "get", "nodes", "-o", "wide")
		require.NoError(t, err, out)
		t.Log("\n" + out)
		for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
			line := lineWith(out, n)
			require.Contains(t, line, " Ready ", "node %s", n)
			require.Contains(t, line, "v1.35.4")
			require.Contains(t, line, "Talos (v1.13.9)")
			require.Contains(t, line, c.Machine(t, n).IP)
		}
		require.Contains(t, lineWith(out, "cp-1"), "control-plane")
		out, err = c.kubectl(t, "get", "pods", "-n", "kube-system", "-l", "tier=control-plane", "-o",
			`custom-columns=NAME:.metadata.name,APP:.metadata.labels.k8s-app,IMAGE:.spec.containers[0].image,READY:.status.containerStatuses[0].ready,CV:.metadata.annotations.talos\.dev/config-version`)
		require.NoError(t, err, out)
		t.Log("\n" + out)
		for _, cp := range []string{"cp-1", "cp-2", "cp-3"} {
			for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				line := lineWith(out, comp+"-"+cp)
				require.Contains(t, line, "registry.k8s.io/"+comp+":v1.35.4")
				require.Contains(t, line, "true")
			}
		}
		out, err = c.kubectl(t, "get", "daemonset", "kube-proxy", "-n", "kube-system")
		require.NoError(t, err, out)
		require.Regexp(t, `kube-proxy\s+5\s+5\s+5`, out)
	})

	t.Run("events.jsonl starts with the state at start", func(t *testing.T) {
		seen := map[string]string{}
		for _, e := range c.Events(t) {
			require.False(t, e.Time.IsZero())
			seen[e.Node+"/"+e.Component] = e.Version
		}
		for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
			require.Equal(t, "v1.13.9", seen[n+"/talos"], n)
			require.Equal(t, "v1.35.4", seen[n+"/kubelet"], n)
			require.Equal(t, "v1.35.4", seen[n+"/kube-proxy"], n)
		}
		for _, n := range []string{"cp-1", "cp-2", "cp-3"} {
			for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
				require.Equal(t, "v1.35.4", seen[n+"/"+comp], n)
			}
		}
		raw, err := os.ReadFile(filepath.Join(c.Dir, "events.jsonl"))
		require.NoError(t, err)
		require.Regexp(t, `^\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z","node":"cp-1","component":"talos","version":"v1.13.9"\}`, string(raw))
	})

	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	defer tc.Close()
	cp1 := c.Machine(t, "cp-1").IP
	worker2 := c.Machine(t, "worker-2").IP

	t.Run("talos API: version with node routing", func(t *testing.T) {
		v, err := tc.Version(client.WithNode(ctx, worker2))
		require.NoError(t, err)
		require.Equal(t, "v1.13.9", v.Messages[0].Version.Tag)
		// apid names each reply's node as the client named it.
		require.Equal(t, worker2, v.Messages[0].Metadata.Hostname)
	})

	t.Run("talos API: apply NO_REBOOT restarts the apiserver on its new image", func(t *testing.T) {
		nctx := client.WithNode(ctx, cp1)
		mc, err := safe.StateGetByID[*config.MachineConfig](nctx, tc.COSI, config.ActiveID)
		require.NoError(t, err)
		require.Equal(t, "registry.k8s.io/kube-apiserver:v1.35.4", mc.Provider().K8sAPIServerConfig().Image())

		watchCtx, cancelWatch := context.WithCancel(nctx)
		defer cancelWatch()
		watch := make(chan state.Event, 16)
		require.NoError(t, tc.COSI.Watch(watchCtx, resource.NewMetadata(config.NamespaceName, config.MachineConfigType, config.ActiveID, resource.VersionUndefined), watch))
		first := <-watch
		require.Equal(t, state.Created, first.Type)

		patched, err := mc.Provider().PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
			cfg.ClusterConfig.APIServerConfig.ContainerImage = "registry.k8s.io/kube-apiserver:v1.36.3"
			return nil
		})
		require.NoError(t, err)
		data, err := patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		require.NoError(t, err)

		dry, err := tc.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT, DryRun: true})
		require.NoError(t, err)
		require.Contains(t, dry.Messages[0].ModeDetails, "v1.36.3")
		after, err := safe.StateGetByID[*config.MachineConfig](nctx, tc.COSI, config.ActiveID)
		require.NoError(t, err)
		require.Equal(t, "registry.k8s.io/kube-apiserver:v1.35.4", after.Provider().K8sAPIServerConfig().Image(), "a dry run changes nothing")

		before := mirrorPod(t, c, "kube-apiserver-cp-1")
		_, err = tc.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT})
		require.NoError(t, err)
		select {
		case ev := <-watch:
			require.Equal(t, state.Updated, ev.Type)
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event for the applied machine config")
		}
		apiCfg, err := safe.StateGetByID[*k8s.APIServerConfig](nctx, tc.COSI, k8s.APIServerConfigID)
		require.NoError(t, err)
		require.Equal(t, "registry.k8s.io/kube-apiserver:v1.36.3", apiCfg.TypedSpec().Image)

		eventually(t, 30*time.Second, "kube-apiserver-cp-1 Ready on v1.36.3", func(ctx context.Context) error {
			p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, "kube-apiserver-cp-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.Containers[0].Image != "registry.k8s.io/kube-apiserver:v1.36.3" || !isReady(p) {
				return fmt.Errorf("image %s ready %v", p.Spec.Containers[0].Image, isReady(p))
			}
			if p.Annotations["talos.dev/config-version"] == before.Annotations["talos.dev/config-version"] {
				return errors.New("config version unchanged")
			}
			return nil
		})
		require.True(t, hasEvent(c.Events(t), "cp-1", "kube-apiserver", "v1.36.3"))
	})

	t.Run("talos API: image pull", func(t *testing.T) {
		stream, err := tc.ImageClient.Pull(client.WithNode(ctx, worker2), &machineapi.ImageServicePullRequest{
			Containerd: &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_CRI},
			ImageRef:   "registry.k8s.io/kube-proxy:v1.36.3",
		})
		require.NoError(t, err)
		for {
			_, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
		}
	})

	t.Run("a changed kubelet image restarts the kubelet", func(t *testing.T) {
		nctx := client.WithNode(ctx, worker2)
		mc, err := safe.StateGetByID[*config.MachineConfig](nctx, tc.COSI, config.ActiveID)
		require.NoError(t, err)
		patched, err := mc.Provider().PatchV1Alpha1(func(cfg *v1alpha1.Config) error {
			cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.36.3"
			return nil
		})
		require.NoError(t, err)
		data, err := patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		require.NoError(t, err)
		_, err = tc.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT})
		require.NoError(t, err)
		sawNotReady := false
		eventually(t, 30*time.Second, "worker-2 Ready with kubelet v1.36.3", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := nodeReady(n)
			if !ready {
				sawNotReady = true
			}
			if n.Status.NodeInfo.KubeletVersion != "v1.36.3" || !ready {
				return fmt.Errorf("kubelet %s ready %v", n.Status.NodeInfo.KubeletVersion, ready)
			}
			return nil
		})
		require.True(t, sawNotReady || hasEvent(c.Events(t), "worker-2", "kubelet", "v1.36.3"))
		require.True(t, hasEvent(c.Events(t), "worker-2", "kubelet", "v1.36.3"))
	})

	t.Run("a pod runs as a process with in-cluster Kubernetes and Talos credentials", func(t *testing.T) {
		restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		require.NoError(t, err)
		dyn := dynamic.NewForConfigOrDie(restCfg)
		ns := "ichor-system"
		_, err = c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = dyn.Resource(schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}).Namespace(ns).Create(ctx,
			&unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "talos.dev/v1alpha1", "kind": "ServiceAccount",
				"metadata": map[string]any{"name": "podcheck-talos"},
				"spec":     map[string]any{"roles": []any{"os:admin"}},
			}}, metav1.CreateOptions{})
		require.NoError(t, err)
		eventually(t, 20*time.Second, "talos service account secret", func(ctx context.Context) error {
			s, err := c.Client.CoreV1().Secrets(ns).Get(ctx, "podcheck-talos", metav1.GetOptions{})
			if err == nil && len(s.Data["config"]) == 0 {
				return errors.New("no config key")
			}
			return err
		})
		_, err = c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "podcheck"}}, metav1.CreateOptions{})
		require.NoError(t, err)
		// The pod lists nodes with its own ServiceAccount's permission.
		out, err := c.kubectl(t, "create", "clusterrole", "podcheck", "--verb=list", "--resource=nodes")
		require.NoError(t, err, out)
		out, err = c.kubectl(t, "create", "clusterrolebinding", "podcheck", "--clusterrole=podcheck", "--serviceaccount=ichor-system:podcheck")
		require.NoError(t, err, out)
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "podcheck", Namespace: ns},
			Spec: batchv1.JobSpec{
				BackoffLimit: new(int32),
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					ServiceAccountName: "podcheck",
					RestartPolicy:      corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name: "check", Image: "ichor.test/podcheck:v1", Command: []string{"/podcheck"},
						SecurityContext: &corev1.SecurityContext{
							RunAsUser:              new(int64(65532)),
							RunAsNonRoot:           new(true),
							ReadOnlyRootFilesystem: new(true),
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "talos", MountPath: "/var/run/secrets/talos.dev", ReadOnly: true},
							// The cluster's directory is under /tmp: an emptyDir there
							// must not hide the other volumes' sources.
							{Name: "tmp", MountPath: "/tmp"},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "talos", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "podcheck-talos"}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				}},
			},
		}
		_, err = c.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
		require.NoError(t, err)
		eventually(t, 60*time.Second, "podcheck job complete", func(ctx context.Context) error {
			j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, "podcheck", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if j.Status.Failed > 0 {
				out, _ := c.kubectl(t, "logs", "-n", ns, "job/podcheck")
				t.Fatalf("podcheck failed:\n%s", out)
			}
			if j.Status.Succeeded == 0 {
				return errors.New("not yet succeeded")
			}
			return nil
		})
		out, err = c.kubectl(t, "logs", "-n", ns, "job/podcheck")
		require.NoError(t, err, out)
		require.Contains(t, out, "kubernetes: 5 nodes")
		require.Contains(t, out, "talos: v1.13.9")
		require.Contains(t, out, "uid 65532, root filesystem read-only, /tmp writable")

		usage, err := filepath.Glob(filepath.Join(c.Dir, "logs", "pods", "ichor-system_podcheck-*_check.usage.json"))
		require.NoError(t, err)
		require.Len(t, usage, 1, "the process's resource usage is written when it ends")
		var u struct {
			ExitCode    int   `json:"exitCode"`
			MaxRSSBytes int64 `json:"maxRSSBytes"`
		}
		b, err := os.ReadFile(usage[0])
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, &u))
		require.Zero(t, u.ExitCode)
		require.Positive(t, u.MaxRSSBytes)
	})

	t.Run("no node was tainted unreachable", func(t *testing.T) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for _, n := range nodes.Items {
			for _, taint := range n.Spec.Taints {
				require.NotEqual(t, "node.kubernetes.io/unreachable", taint.Key, n.Name)
			}
		}
	})
}

// TestSimulatorBadFlags checks that ichor-sim refuses bad input with one
// clear line and a non-zero exit.
func TestSimulatorBadFlags(t *testing.T) {
	t.Parallel()

	sim := env(t, "ICHOR_SIM")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no dir", []string{"up"}, "--dir is required"},
		{"bad kubernetes version", []string{"up", "--dir", t.TempDir(), "--kubernetes", "1.35"}, `--kubernetes "1.35": want a version like v1.35.4`},
		{"bad talos version", []string{"up", "--dir", t.TempDir(), "--talos", "latest"}, `--talos "latest"`},
		{"unsupported pairing", []string{"up", "--dir", t.TempDir(), "--kubernetes", "v1.29.0", "--talos", "v1.13.9"}, "pick a pair that Talos supports"},
		{"no control plane", []string{"up", "--dir", t.TempDir(), "--control-planes", "0"}, "at least 1 control plane"},
		{"unknown command", []string{"start"}, `unknown command "start"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(sim, tc.args...).CombinedOutput()
			require.Error(t, err)
			require.Contains(t, string(out), tc.want)
		})
	}
}

// TestTwoClustersAtOnce checks that clusters in different directories run
// side by side on their own addresses.
func TestTwoClustersAtOnce(t *testing.T) {
	t.Parallel()

	a := startCluster(t, "--control-planes", "1", "--workers", "0")
	b := startCluster(t, "--control-planes", "1", "--workers", "1")
	require.NotEqual(t, a.Info.APIServer, b.Info.APIServer)
	require.NotEqual(t, a.Info.Machines[0].IP, b.Info.Machines[0].IP)
	for _, c := range []*Cluster{a, b} {
		out, err := c.kubectl(t, "get", "nodes")
		require.NoError(t, err, out)
		require.Equal(t, len(c.Info.Machines)+1, len(strings.Split(strings.TrimSpace(out), "\n")))
	}
}

func buildPodcheck(t *testing.T) string {
	t.Helper()
	// An image's files are readable by any user: not t.TempDir (0700).
	root, err := os.MkdirTemp("", "podcheck-image-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(root, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	cmd := exec.Command("go", "build", "-o", filepath.Join(root, "podcheck"), "./internal/podcheck")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return root
}

func lineWith(out, word string) string {
	for _, l := range strings.Split(out, "\n") {
		for _, f := range strings.Fields(l) {
			if f == word {
				return l
			}
		}
	}
	return ""
}

func mirrorPod(t *testing.T, c *Cluster, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("kube-system").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return p
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func hasEvent(evs []events.Event, node, component, version string) bool {
	for _, e := range evs {
		if e.Node == node && e.Component == component && e.Version == version {
			return true
		}
	}
	return false
}
