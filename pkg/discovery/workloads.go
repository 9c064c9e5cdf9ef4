package discovery

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkloadsPageSize is how many pods one list request returns: a cluster of
// any size is read in pages, never in one response that must fit in memory
// twice (kubectl drain's own chunk size).
const WorkloadsPageSize = 500

// Workloads are the pods and DaemonSets a drain preview needs.
type Workloads struct {
	// Pods are every pod bound to a node, reduced to what a drain's rules
	// read: metadata (without managed fields), the volumes, the scheduling
	// constraints and the phase.
	Pods []corev1.Pod
	// DaemonSets are every DaemonSet, by namespace/name: a drain leaves their
	// pods, and refuses a pod whose DaemonSet is gone.
	DaemonSets map[string]bool
	// KubeProxyPodReady is the time a pod of the kube-proxy DaemonSet took from its
	// start to Ready (see startToReady), the mean over those that show it: the API
	// keeps both times to the second, and the mean of the pods' differences comes
	// near the true time where the shortest would be a second under; 0 when none
	// shows it.
	KubeProxyPodReady time.Duration
}

// maxStartToReady bounds the start-to-Ready a pod is taken to show: a pod whose Ready
// last changed later than that after its start became Ready again after a restart or
// its node's reboot, which says nothing of a start.
const maxStartToReady = 2 * time.Minute

// startToReady is how long p took from its start (status.startTime) to Ready (its
// Ready condition's last transition), when it is Ready and that is under
// maxStartToReady; 0 otherwise.
func startToReady(p *corev1.Pod) time.Duration {
	if p.Status.StartTime == nil {
		return 0
	}

	for _, c := range p.Status.Conditions {
		if c.Type != corev1.PodReady || c.Status != corev1.ConditionTrue {
			continue
		}

		if d := c.LastTransitionTime.Sub(p.Status.StartTime.Time); d > 0 && d <= maxStartToReady {
			return d
		}
	}

	return 0
}

// isKubeProxyPod reports whether p is a pod of the kube-proxy DaemonSet.
func isKubeProxyPod(p *corev1.Pod) bool {
	if p.Namespace != StaticPodNamespace {
		return false
	}

	owner := metav1.GetControllerOf(p)

	return owner != nil && owner.Kind == "DaemonSet" && owner.Name == KubeProxyDaemonSet
}

// Workloads lists every pod (in pages of WorkloadsPageSize) and every
// DaemonSet (in pages too). A cluster of n pods costs n/500 + 1 requests
// or so, whatever its node count.
func (d *Discoverer) Workloads(ctx context.Context) (*Workloads, error) {
	w := &Workloads{DaemonSets: map[string]bool{}}

	var ready []time.Duration

	opts := metav1.ListOptions{Limit: WorkloadsPageSize}

	for {
		list, err := d.Kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, kubeError(d.Endpoint, "list", "pods", "", err)
		}

		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.NodeName != "" {
				w.Pods = append(w.Pods, reducedPod(p))
			}

			if d := startToReady(p); d > 0 && isKubeProxyPod(p) {
				ready = append(ready, d)
			}
		}

		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}

	if len(ready) > 0 {
		var sum time.Duration
		for _, d := range ready {
			sum += d
		}

		w.KubeProxyPodReady = sum / time.Duration(len(ready))
	}

	opts = metav1.ListOptions{Limit: WorkloadsPageSize}

	for {
		list, err := d.Kube.AppsV1().DaemonSets(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, kubeError(d.Endpoint, "list", "daemonsets.apps", "", err)
		}

		for _, ds := range list.Items {
			w.DaemonSets[ds.Namespace+"/"+ds.Name] = true
		}

		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}

	return w, nil
}

// reducedPod keeps what the drain rules read; a 1000-node cluster's pods
// are held at a fraction of their full size.
func reducedPod(p *corev1.Pod) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         p.Namespace,
			Name:              p.Name,
			UID:               p.UID,
			Labels:            p.Labels,
			Annotations:       mirrorOnly(p.Annotations),
			OwnerReferences:   p.OwnerReferences,
			DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{
			NodeName:     p.Spec.NodeName,
			NodeSelector: p.Spec.NodeSelector,
			Affinity:     p.Spec.Affinity,
			Tolerations:  p.Spec.Tolerations,
			Volumes:      p.Spec.Volumes,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
}

// mirrorOnly keeps the one annotation a drain reads: the mirror pod's.
func mirrorOnly(annotations map[string]string) map[string]string {
	if v, ok := annotations[corev1.MirrorPodAnnotationKey]; ok {
		return map[string]string{corev1.MirrorPodAnnotationKey: v}
	}

	return nil
}
