package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// waitClusterReady waits until every node is Ready, every control plane has
// its three static pods' mirror pods Ready, and every kube-proxy pod is Ready.
func waitClusterReady(ctx context.Context, cp *controlPlane, nodes, controlPlanes int, timeout time.Duration) error {
	return waitFor(ctx, "cluster", timeout, nil, func(ctx context.Context) error {
		if err := cp.alive(); err != nil {
			return err
		}
		nl, err := cp.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nl.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready != nodes {
			return fmt.Errorf("%d/%d nodes Ready", ready, nodes)
		}
		pl, err := cp.client.CoreV1().Pods(metav1.NamespaceSystem).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		static, proxies, proxiesReady := 0, 0, 0
		for _, p := range pl.Items {
			r := podReady(&p)
			switch p.Labels["k8s-app"] {
			case "kube-apiserver", "kube-controller-manager", "kube-scheduler":
				if r {
					static++
				}
			case "kube-proxy":
				proxies++
				if r {
					proxiesReady++
				}
			}
		}
		if static != 3*controlPlanes {
			return fmt.Errorf("%d/%d static pods Ready", static, 3*controlPlanes)
		}
		ds, err := cp.client.AppsV1().DaemonSets(metav1.NamespaceSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err == nil && (ds.Status.DesiredNumberScheduled != int32(nodes) || ds.Status.NumberReady != int32(nodes)) {
			return fmt.Errorf("kube-proxy %d/%d Ready", ds.Status.NumberReady, nodes)
		}
		return nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
