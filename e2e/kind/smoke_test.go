package kind

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// eventually polls check every 2 s until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := waitFor(ctx, "the condition", check); err != nil {
		t.Fatal(err)
	}
}

// TestNodesReady: every node of the cluster registers and is Ready.
func TestNodesReady(t *testing.T) {
	eventually(t, 3*time.Minute, func() error {
		nodes, err := env.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if want := env.controlPlanes + env.workers; len(nodes.Items) != want {
			return fmt.Errorf("%d nodes, want %d", len(nodes.Items), want)
		}
		for _, n := range nodes.Items {
			if !ready(n) {
				return fmt.Errorf("node %s is not Ready", n.Name)
			}
		}
		return nil
	})
}

// TestAPIServerVersions asks each control plane node's own apiserver (not
// the load balancer) for /version: each answers with the node image's
// Kubernetes version, which every kubelet reports too.
func TestAPIServerVersions(t *testing.T) {
	nodes, err := env.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{LabelSelector: "node-role.kubernetes.io/control-plane"})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != env.controlPlanes {
		t.Fatalf("%d control plane nodes, want %d", len(nodes.Items), env.controlPlanes)
	}
	want := nodes.Items[0].Status.NodeInfo.KubeletVersion
	for _, n := range nodes.Items {
		ip := internalIP(n)
		if ip == "" {
			t.Fatalf("node %s has no InternalIP", n.Name)
		}
		cfg := rest.CopyConfig(env.config)
		cfg.Host = "https://" + ip + ":6443"
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v, err := dc.ServerVersion()
		if err != nil {
			t.Fatalf("%s: /version: %v", n.Name, err)
		}
		t.Logf("%s (%s): apiserver %s, kubelet %s", n.Name, ip, v.GitVersion, n.Status.NodeInfo.KubeletVersion)
		if v.GitVersion != want || n.Status.NodeInfo.KubeletVersion != want {
			t.Errorf("%s: apiserver %s, kubelet %s, want %s", n.Name, v.GitVersion, n.Status.NodeInfo.KubeletVersion, want)
		}
	}
}

// TestCoreDNSReady: CoreDNS runs on the pod network (the node image's CNI)
// and answers its readiness probe, which needs the apiserver through the
// kubernetes Service (kube-proxy).
func TestCoreDNSReady(t *testing.T) {
	eventually(t, 3*time.Minute, func() error {
		d, err := env.client.AppsV1().Deployments("kube-system").Get(context.Background(), "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas < 1 || d.Status.ReadyReplicas != d.Status.Replicas {
			return fmt.Errorf("coredns: %d of %d replicas ready", d.Status.ReadyReplicas, d.Status.Replicas)
		}
		return nil
	})
}

func ready(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func internalIP(n corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}
