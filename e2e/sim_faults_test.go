//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSimulatorFaults checks every fault the simulator injects, switched on
// and off while the cluster runs, and a Talos upgrade with its reboot.
func TestSimulatorFaults(t *testing.T) {
	t.Parallel()

	faultsFile := filepath.Join(t.TempDir(), "faults.yaml")
	c := startCluster(t, "--control-planes", "1", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.12.4", "--faults", faultsFile)
	setFaults := func(doc string) {
		t.Helper()
		require.NoError(t, os.WriteFile(faultsFile, []byte(doc), 0o644))
	}
	ctx := context.Background()
	tc, err := client.New(ctx, client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	defer tc.Close()
	ip := func(n string) string { return c.Machine(t, n).IP }
	apply := func(t *testing.T, ctx context.Context, node string, patch func(*v1alpha1.Config)) error {
		t.Helper()
		nctx := client.WithNode(ctx, ip(node))
		mc, err := safe.StateGetByID[*config.MachineConfig](nctx, tc.COSI, config.ActiveID)
		require.NoError(t, err)
		patched, err := mc.Provider().PatchV1Alpha1(func(cfg *v1alpha1.Config) error { patch(cfg); return nil })
		require.NoError(t, err)
		data, err := patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
		require.NoError(t, err)
		_, err = tc.ApplyConfiguration(nctx, &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT})
		return err
	}

	t.Run("neverReady: a restarted static pod never gets Ready", func(t *testing.T) {
		setFaults("nodes:\n  cp-1:\n    neverReady: [kube-scheduler]\n")
		require.NoError(t, apply(t, ctx, "cp-1", func(cfg *v1alpha1.Config) {
			cfg.ClusterConfig.SchedulerConfig.ContainerImage = "registry.k8s.io/kube-scheduler:v1.35.5"
		}))
		eventually(t, 30*time.Second, "scheduler on the new image", func(ctx context.Context) error {
			p, err := c.Client.CoreV1().Pods("kube-system").Get(ctx, "kube-scheduler-cp-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Spec.Containers[0].Image != "registry.k8s.io/kube-scheduler:v1.35.5" {
				return errors.New("old image")
			}
			return nil
		})
		// Well past the simulated readiness latency, it is still not Ready.
		time.Sleep(4 * time.Second)
		require.False(t, isReady(mirrorPod(t, c, "kube-scheduler-cp-1")))
		setFaults("")
	})

	t.Run("stayNotReady: the node stays NotReady until the fault is cleared", func(t *testing.T) {
		setFaults("nodes:\n  worker-1:\n    stayNotReady: true\n")
		require.NoError(t, apply(t, ctx, "worker-1", func(cfg *v1alpha1.Config) {
			cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.35.5"
		}))
		eventually(t, 30*time.Second, "worker-1 on kubelet v1.35.5", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n.Status.NodeInfo.KubeletVersion != "v1.35.5" {
				return errors.New(n.Status.NodeInfo.KubeletVersion)
			}
			return nil
		})
		time.Sleep(4 * time.Second)
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		require.False(t, nodeReady(n))
		setFaults("")
		eventually(t, 30*time.Second, "worker-1 Ready once the fault is cleared", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !nodeReady(n) {
				return errors.New("NotReady")
			}
			return nil
		})
	})

	t.Run("pullFails: image pulls fail", func(t *testing.T) {
		setFaults("nodes:\n  worker-2:\n    pullFails: true\n")
		defer setFaults("")
		// Talos v1.12.4 has no ImageService: MachineService.ImagePull.
		err := tc.ImagePull(client.WithNode(ctx, ip("worker-2")), common.ContainerdNamespace_NS_CRI, "registry.k8s.io/kube-proxy:v1.36.3") //nolint:staticcheck // the call of Talos 1.12
		require.Error(t, err)
		require.Contains(t, err.Error(), "not found")
	})

	t.Run("applyBlocks: an apply blocks past the caller's deadline and changes nothing", func(t *testing.T) {
		setFaults("nodes:\n  worker-2:\n    applyBlocks: true\n")
		defer setFaults("")
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		err := apply(t, actx, "worker-2", func(cfg *v1alpha1.Config) {
			cfg.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.35.5"
		})
		require.Equal(t, codes.DeadlineExceeded, client.StatusCode(err), "%v", err)
		mc, err := safe.StateGetByID[*config.MachineConfig](client.WithNode(ctx, ip("worker-2")), tc.COSI, config.ActiveID)
		require.NoError(t, err)
		require.Equal(t, "ghcr.io/siderolabs/kubelet:v1.35.4", mc.Provider().K8sKubeletConfig().Image())
	})

	t.Run("unreachable: the Talos API refuses connections while set", func(t *testing.T) {
		setFaults("nodes:\n  worker-2:\n    unreachable: true\n")
		eventually(t, 10*time.Second, "worker-2's endpoint refuses connections", func(context.Context) error {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip("worker-2"), "50000"), time.Second)
			if err != nil {
				return nil
			}
			_ = conn.Close()
			return errors.New("still accepting")
		})
		_, err := tc.Version(client.WithNode(ctx, ip("worker-2")))
		require.Equal(t, codes.Unavailable, client.StatusCode(err), "%v", err)
		setFaults("")
		eventually(t, 10*time.Second, "worker-2 reachable again", func(ctx context.Context) error {
			_, err := tc.Version(client.WithNode(ctx, ip("worker-2")))
			return err
		})
	})

	t.Run("a Talos upgrade drains, reboots into the new version and uncordons", func(t *testing.T) {
		nctx := client.WithNode(ctx, ip("worker-1"))
		before := bootID(t, nctx, tc)
		_, err := tc.MachineClient.Upgrade(nctx, &machineapi.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.9"})
		require.NoError(t, err)
		sawCordon := false
		eventually(t, 60*time.Second, "worker-1 back on Talos v1.13.9, Ready and schedulable", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if n.Spec.Unschedulable {
				sawCordon = true
			}
			if n.Status.NodeInfo.OSImage != "Talos (v1.13.9)" || !nodeReady(n) || n.Spec.Unschedulable {
				return fmt.Errorf("%s ready=%v unschedulable=%v", n.Status.NodeInfo.OSImage, nodeReady(n), n.Spec.Unschedulable)
			}
			return nil
		})
		require.True(t, sawCordon, "Talos cordons the node before its reboot")
		v, err := tc.Version(nctx)
		require.NoError(t, err)
		require.Equal(t, "v1.13.9", v.Messages[0].Version.Tag)
		require.NotEqual(t, before, bootID(t, nctx, tc))
		require.True(t, hasEvent(c.Events(t), "worker-1", "talos", "v1.13.9"))
	})

	t.Run("a rebooted node comes Ready a readiness latency after its kubelet starts", func(t *testing.T) {
		nctx := client.WithNode(ctx, ip("worker-2"))
		before := bootID(t, nctx, tc)
		require.NoError(t, tc.Reboot(nctx))

		// Seen on its new boot and NotReady (its runtime and network starting),
		// then Ready: a real node is not Ready the moment its kubelet starts.
		sawStarting := false
		eventually(t, 60*time.Second, "worker-2 Ready on a new boot", func(ctx context.Context) error {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
			if err != nil {
				return err
			}
			newBoot := n.Status.NodeInfo.BootID != "" && n.Status.NodeInfo.BootID != before
			if newBoot && !nodeReady(n) && strings.Contains(readyMessage(n), "the node is starting") {
				sawStarting = true
			}
			if !newBoot || !nodeReady(n) {
				return fmt.Errorf("boot %s ready=%v (%s)", n.Status.NodeInfo.BootID, nodeReady(n), readyMessage(n))
			}
			return nil
		})
		require.True(t, sawStarting, "NotReady on its new boot before Ready")
	})

	t.Run("abFallback: the upgrade boots back into the old version", func(t *testing.T) {
		setFaults("nodes:\n  worker-2:\n    abFallback: true\n")
		defer setFaults("")
		nctx := client.WithNode(ctx, ip("worker-2"))
		before := bootID(t, nctx, tc)
		// Talos v1.12.4 has MachineService.Upgrade only: it installs and reboots by itself.
		_, err := tc.MachineClient.Upgrade(nctx, &machineapi.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.9"})
		require.NoError(t, err)
		eventually(t, 60*time.Second, "worker-2 rebooted", func(ctx context.Context) error {
			id, err := readBootID(client.WithNode(ctx, ip("worker-2")), tc)
			if err != nil {
				return err
			}
			if id == before {
				return errors.New("same boot ID")
			}
			return nil
		})
		v, err := tc.Version(nctx)
		require.NoError(t, err)
		require.Equal(t, "v1.12.4", v.Messages[0].Version.Tag, "an A/B fallback keeps the old version")
	})

	t.Run("apiServerDown: the kube-apiserver stops, and starts again once cleared", func(t *testing.T) {
		readyz := func(ctx context.Context) error {
			return c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
		}
		setFaults("apiServerDown: true\n")
		eventually(t, 30*time.Second, "the kube-apiserver gone", func(ctx context.Context) error {
			if readyz(ctx) == nil {
				return errors.New("still answers")
			}
			return nil
		})
		// The Talos API is the machines', not the apiserver's: it still answers.
		_, err := tc.Version(client.WithNode(ctx, ip("cp-1")))
		require.NoError(t, err)
		setFaults("")
		eventually(t, 90*time.Second, "the kube-apiserver ready again", readyz)
		eventually(t, 90*time.Second, "every Node Ready again", func(ctx context.Context) error {
			nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for i := range nodes.Items {
				if !nodeReady(&nodes.Items[i]) {
					return fmt.Errorf("%s not Ready", nodes.Items[i].Name)
				}
			}
			return nil
		})
	})

	t.Run("eviction: kubectl drain moves the pods off a node", func(t *testing.T) {
		out, err := c.kubectl(t, "drain", "worker-2", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s")
		require.NoError(t, err, out)
		pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		require.NoError(t, err)
		for _, p := range pods.Items {
			require.NotEqual(t, "worker-2", p.Spec.NodeName, "pod %s", p.Name)
		}
		out, err = c.kubectl(t, "uncordon", "worker-2")
		require.NoError(t, err, out)
	})
}

func readBootID(nctx context.Context, tc *client.Client) (string, error) {
	stream, err := tc.MachineClient.Read(nctx, &machineapi.ReadRequest{Path: "/proc/sys/kernel/random/boot_id"})
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
		b.Write(msg.GetBytes())
	}
	return strings.TrimSpace(b.String()), nil
}

// readyMessage is the message of the Node's Ready condition.
func readyMessage(n *corev1.Node) string {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Message
		}
	}
	return ""
}

func bootID(t *testing.T, nctx context.Context, tc *client.Client) string {
	t.Helper()
	id, err := readBootID(nctx, tc)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	return id
}
