package kind

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kind/pkg/cluster/constants"

	"github.com/ichor-dev/kubectl-ichor/e2e/kind/talosnode"
)

// talosVersion is the Talos version the kind nodes' machines run
// (ICHOR_KIND_TALOS, default v1.13.9).
func talosVersion() string {
	if v := os.Getenv("ICHOR_KIND_TALOS"); v != "" {
		return v
	}
	return "v1.13.9"
}

// startTalos makes the kind nodes Talos nodes (package talosnode) and waits
// until every node is Ready and CoreDNS answers.
func startTalos() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	all, err := env.provider.ListNodes(env.name)
	if err != nil {
		return err
	}
	var nodes []talosnode.Node
	endpoint := ""
	for _, n := range all {
		role, err := n.Role()
		if err != nil {
			return err
		}
		v4, _, err := n.IP()
		if err != nil {
			return fmt.Errorf("%s: %w", n.String(), err)
		}
		ip, err := netip.ParseAddr(v4)
		if err != nil {
			return fmt.Errorf("%s: address %q: %w", n.String(), v4, err)
		}
		switch role {
		case constants.ExternalLoadBalancerNodeRoleValue:
			endpoint = "https://" + v4 + ":6443"
		case constants.ControlPlaneNodeRoleValue, constants.WorkerNodeRoleValue:
			nodes = append(nodes, talosnode.Node{Name: n.String(), IP: ip, ControlPlane: role == constants.ControlPlaneNodeRoleValue})
		}
	}
	// Control planes first, by name: the first bootstraps the manifests.
	slices.SortFunc(nodes, func(a, b talosnode.Node) int {
		if a.ControlPlane != b.ControlPlane {
			if a.ControlPlane {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	if endpoint == "" { // one control plane: no load balancer
		endpoint = "https://" + nodes[0].IP.String() + ":6443"
	}
	first := nodes[0].Name
	out, err := nodeOutput(ctx, first, "cat", "/kind/version")
	if err != nil {
		return err
	}
	from := strings.TrimSpace(out)
	// Each version's binaries, for the upgrades: only in make kind-image's
	// node image (an upstream one carries its own version only).
	out, _ = nodeOutput(ctx, first, "ls", "/kind/k8s")
	env.versions = []string{from}
	for _, v := range strings.Fields(out) {
		if v != from {
			env.versions = append(env.versions, v)
		}
	}
	slices.SortFunc(env.versions[1:], semver.Compare)
	if out, err = nodeOutput(ctx, first, "kubeadm", "config", "images", "list", "--kubernetes-version", from); err != nil {
		return err
	}
	coreDNS := ""
	for _, ref := range strings.Fields(out) {
		if strings.Contains(ref, "/coredns") {
			coreDNS = ref
		}
	}
	env.coreDNSImage = coreDNS
	kubeconfig, err := os.ReadFile(env.kubeconfig)
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(env.artifacts, "talos.log"))
	if err != nil {
		return err
	}
	env.talos, err = talosnode.Start(context.Background(), talosnode.Options{
		Name:              env.name,
		Nodes:             nodes,
		Endpoint:          endpoint,
		TalosVersion:      talosVersion(),
		KubernetesVersion: from,
		CoreDNSImage:      coreDNS,
		PodSubnet:         "10.244.0.0/16",
		ServiceSubnet:     "10.96.0.0/16",
		AdminKubeconfig:   kubeconfig,
		RestConfig:        env.config,
		Dir:               env.artifacts,
		Log:               slog.New(slog.NewTextHandler(logFile, nil)),
	})
	if err != nil {
		return err
	}
	env.talosconfig = env.talos.Talosconfig
	return waitFor(ctx, "every node Ready and CoreDNS answering", func() error {
		list, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range list.Items {
			if !ready(n) {
				return fmt.Errorf("node %s is not Ready", n.Name)
			}
		}
		d, err := env.client.AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		return rolledOut(d)
	})
}

func rolledOut(d *appsv1.Deployment) error {
	if d.Status.ReadyReplicas < 1 || d.Status.ReadyReplicas != d.Status.Replicas {
		return fmt.Errorf("deployment %s: %d of %d replicas ready", d.Name, d.Status.ReadyReplicas, d.Status.Replicas)
	}
	return nil
}

// waitFor polls check every 2 s until it returns nil or ctx ends.
func waitFor(ctx context.Context, what string, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(2 * time.Second):
		}
	}
}

// nodeOutput runs a command in a node's container.
func nodeOutput(ctx context.Context, node string, args ...string) (string, error) {
	out, err := talosnode.Exec(ctx, node, nil, args...)
	return string(out), err
}
