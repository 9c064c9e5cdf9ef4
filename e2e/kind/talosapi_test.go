package kind

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTalosAPIOnEveryNode: each node answers the Talos API on its own IP as
// Talos' apid does (its version, its hostname), and the kubelet reports the
// Talos version in the Node's osImage, as on Talos.
func TestTalosAPIOnEveryNode(t *testing.T) {
	cfg, err := clientconfig.Open(env.talosconfig)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := env.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		ip := internalIP(n)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := client.New(ctx, client.WithConfig(cfg), client.WithEndpoints(ip))
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", n.Name, err)
		}
		v, err := c.Version(client.WithNode(ctx, ip))
		if err == nil && len(v.Messages) == 1 {
			got := v.Messages[0].Version.Tag
			if got != talosVersion() {
				err = fmt.Errorf("Talos %s, want %s", got, talosVersion())
			}
		}
		if err != nil {
			t.Errorf("%s (%s): Version: %v", n.Name, ip, err)
		}
		if want := "Talos (" + talosVersion() + ")"; n.Status.NodeInfo.OSImage != want {
			t.Errorf("%s: osImage %q, want %q", n.Name, n.Status.NodeInfo.OSImage, want)
		}
		_ = c.Close()
		cancel()
	}
}

// TestKubeProxyThroughKubePrism: kube-proxy, from the machines' bootstrap
// manifests, runs on every node and reaches the apiserver through KubePrism
// (127.0.0.1:7445 on its own node), workers included.
func TestKubeProxyThroughKubePrism(t *testing.T) {
	eventually(t, 3*time.Minute, func() error {
		ds, err := env.client.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if want := int32(env.controlPlanes + env.workers); ds.Status.NumberReady != want {
			return fmt.Errorf("kube-proxy: %d of %d ready", ds.Status.NumberReady, want)
		}
		cm, err := env.client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "kubeconfig-in-cluster", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !strings.Contains(cm.Data["kubeconfig"], "https://127.0.0.1:7445") {
			return fmt.Errorf("kubeconfig-in-cluster does not point at KubePrism:\n%s", cm.Data["kubeconfig"])
		}
		return nil
	})
}
