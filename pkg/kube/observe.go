package kube

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// Running is one component the cluster runs somewhere.
type Running struct {
	// Node is where it runs.
	Node string
	// Component is the component.
	Component discovery.Component
	// Version is its version: the tag of its image, or the Node's
	// kubeletVersion for a kubelet.
	Version string
	// Image is the image it was read from ("" for a kubelet, or when none was seen).
	Image string
	// Source names what it was read from ("pod kube-system/kube-proxy-x7k2p",
	// "Node cp-1").
	Source string
}

// Observe reads what the cluster runs with two LISTs: every Node's kubelet
// version, and the image of every control-plane mirror pod and kube-proxy
// pod in kube-system that has not finished. Temporary failures are retried.
func Observe(ctx context.Context, client kubernetes.Interface) ([]Running, error) {
	var (
		nodes *corev1.NodeList
		pods  *corev1.PodList
	)

	err := Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		nodes, err = client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}

	err = Retry(ctx, 0, func(ctx context.Context) error {
		var err error

		pods, err = client.CoreV1().Pods(discovery.StaticPodNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: fmt.Sprintf("%s in (%s)", discovery.ComponentLabel, strings.Join(CacheComponents(), ",")),
		})

		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list pods in %s: %w", discovery.StaticPodNamespace, err)
	}

	nodePtrs := make([]*corev1.Node, 0, len(nodes.Items))
	for i := range nodes.Items {
		nodePtrs = append(nodePtrs, &nodes.Items[i])
	}

	podPtrs := make([]*corev1.Pod, 0, len(pods.Items))
	for i := range pods.Items {
		podPtrs = append(podPtrs, &pods.Items[i])
	}

	return running(nodePtrs, podPtrs), nil
}

// Running is what Observe reads, as the cache's watches last saw it: every Node's
// kubelet version and the image of every control-plane mirror pod and kube-proxy pod in
// kube-system that has not finished. It makes no request, so a check that runs at every
// node of a large cluster does not list the whole cluster each time.
func (c *Cache) Running() []Running {
	nodes, _ := c.nodes.List(labels.Everything())
	pods, _ := c.pods.Pods(discovery.StaticPodNamespace).List(labels.Everything())

	return running(nodes, pods)
}

// running is what nodes and pods say the cluster runs, sorted by node and component.
func running(nodes []*corev1.Node, pods []*corev1.Pod) []Running {
	var out []Running

	apiservers := map[string]bool{}

	for _, n := range nodes {
		out = append(out, Running{
			Node: n.Name, Component: discovery.Kubelet, Version: n.Status.NodeInfo.KubeletVersion, Source: "Node " + n.Name,
		})
	}

	for _, p := range pods {
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}

		comp := discovery.Component(p.Labels[discovery.ComponentLabel])
		if comp == discovery.APIServer {
			apiservers[p.Spec.NodeName] = true
		}

		image := ContainerImage(p.Spec, string(comp))

		out = append(out, Running{
			Node:      p.Spec.NodeName,
			Component: comp,
			Version:   render.TagOf(image),
			Image:     image,
			Source:    "pod " + p.Namespace + "/" + p.Name,
		})
	}

	// A control plane without a running apiserver mirror pod has an apiserver whose
	// version is unknown: it is said, not left out, so that the invariant is not judged
	// without it.
	for _, n := range nodes {
		if _, cp := n.Labels[discovery.ControlPlaneLabel]; !cp || apiservers[n.Name] {
			continue
		}

		out = append(out, Running{
			Node: n.Name, Component: discovery.APIServer,
			Source: fmt.Sprintf("no %s mirror pod in %s on control plane %s", discovery.APIServer, discovery.StaticPodNamespace, n.Name),
		})
	}

	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}

		return out[i].Component < out[j].Component
	})

	return out
}
