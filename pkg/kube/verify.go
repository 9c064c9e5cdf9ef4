package kube

import (
	"fmt"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// NodeExpect is what a node must show to be verified.
type NodeExpect struct {
	// Node is the Node's name.
	Node string
	// KubeletVersion, when not empty, is the status.nodeInfo.kubeletVersion
	// the Node must report.
	KubeletVersion string
	// StaticPods are the tags the node's control-plane static pods must run,
	// Ready, by component (their mirror pods in kube-system, found by k8s-app
	// label and spec.nodeName).
	StaticPods map[discovery.Component]string
}

// NodeVerified is the Condition that the node is Ready and runs what e
// expects. What it waits for names each thing not yet so, such as
// "node NotReady (KubeletNotReady: kubelet is restarting)" or
// "kube-scheduler-cp-2 on v1.36.3 not Ready".
func (c *Cache) NodeVerified(e NodeExpect) Condition {
	return func() (bool, string) {
		n, ok := c.Node(e.Node)
		if !ok {
			return false, "no Node " + e.Node
		}

		var waiting []string

		if ready, why := NodeReady(n); !ready {
			waiting = append(waiting, "node NotReady"+why)
		}

		if e.KubeletVersion != "" && n.Status.NodeInfo.KubeletVersion != e.KubeletVersion {
			waiting = append(waiting, fmt.Sprintf("kubelet %s, want %s", orUnknown(n.Status.NodeInfo.KubeletVersion), e.KubeletVersion))
		}

		for _, comp := range discovery.StaticPodComponents() {
			tag, ok := e.StaticPods[comp]
			if !ok {
				continue
			}

			if w := staticPodWaiting(c.MirrorPods(e.Node, comp), e.Node, comp, tag); w != "" {
				waiting = append(waiting, w)
			}
		}

		return len(waiting) == 0, strings.Join(waiting, "; ")
	}
}

// staticPodWaiting says what is missing for one component's mirror pod on a
// node to be Ready on tag; "" when one is.
func staticPodWaiting(pods []*corev1.Pod, node string, comp discovery.Component, tag string) string {
	if len(pods) == 0 {
		return fmt.Sprintf("no %s mirror pod on %s", comp, node)
	}

	var seen []string

	for _, p := range pods {
		image := ""
		if len(p.Spec.Containers) > 0 {
			image = p.Spec.Containers[0].Image
		}

		switch {
		case render.TagOf(image) != tag:
			seen = append(seen, fmt.Sprintf("%s on %s, want %s", p.Name, orUnknown(render.TagOf(image)), tag))
		case !PodReady(p):
			seen = append(seen, fmt.Sprintf("%s on %s not Ready", p.Name, tag))
		default:
			return ""
		}
	}

	return strings.Join(seen, ", ")
}

// DaemonSetRolledOut is the Condition that the DaemonSet name in kube-system
// runs tag in its container named container (or its first container) on
// every node it schedules to, all available: what `kubectl rollout status`
// checks, plus the image.
func (c *Cache) DaemonSetRolledOut(name, container, tag string) Condition {
	return func() (bool, string) {
		ds, ok := c.DaemonSet(name)
		if !ok {
			return false, fmt.Sprintf("no DaemonSet %s/%s", discovery.StaticPodNamespace, name)
		}

		return DaemonSetRollout(ds, container, tag)
	}
}

// DaemonSetRollout says whether ds has rolled out tag, or what it waits for.
func DaemonSetRollout(ds *appsv1.DaemonSet, container, tag string) (bool, string) {
	image := ContainerImage(ds.Spec.Template.Spec, container)
	st := ds.Status

	switch {
	case render.TagOf(image) != tag:
		return false, fmt.Sprintf("DaemonSet %s runs %s, want %s", ds.Name, orUnknown(image), tag)
	case ds.Generation > st.ObservedGeneration:
		return false, fmt.Sprintf("DaemonSet %s: generation %d not yet observed", ds.Name, ds.Generation)
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		return false, fmt.Sprintf("DaemonSet %s: %d of %d pods updated to %s", ds.Name, st.UpdatedNumberScheduled, st.DesiredNumberScheduled, tag)
	case st.NumberAvailable < st.DesiredNumberScheduled:
		return false, fmt.Sprintf("DaemonSet %s: %d of %d updated pods available", ds.Name, st.NumberAvailable, st.DesiredNumberScheduled)
	}

	return true, fmt.Sprintf("DaemonSet %s: %d of %d pods on %s", ds.Name, st.NumberAvailable, st.DesiredNumberScheduled, tag)
}

// ContainerImage returns the image of the container named name in spec, or
// of its first container when none has that name.
func ContainerImage(spec corev1.PodSpec, name string) string {
	for _, c := range spec.Containers {
		if c.Name == name {
			return c.Image
		}
	}

	if len(spec.Containers) > 0 {
		return spec.Containers[0].Image
	}

	return ""
}

// NodeReady reports the Node's Ready condition and, when not Ready, why
// (" (reason: message)", or "" when the Node says nothing).
func NodeReady(n *corev1.Node) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}

		if c.Status == corev1.ConditionTrue {
			return true, ""
		}

		switch {
		case c.Reason != "" && c.Message != "":
			return false, fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
		case c.Reason != "" || c.Message != "":
			return false, fmt.Sprintf(" (%s%s)", c.Reason, c.Message)
		}

		return false, ""
	}

	return false, " (no Ready condition)"
}

// StartingWindow is how long after a node turned NotReady, its kubelet up and
// posting it (discovery.NotReadySince), the upgrade takes it for a node still starting and
// waits for it to come Ready before refusing it.
const StartingWindow = 5 * time.Minute

// PodReady reports the pod's Ready condition.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}

	return false
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}

	return s
}
