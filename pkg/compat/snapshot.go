package compat

import (
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// FromSnapshot is what the rules read of a discovered cluster: each node's Talos
// version (when its Talos was read) and every Kubernetes version it runs: its kubelet
// (the Node's kubeletVersion), each image of its machine config (what Talos starts
// after a reboot) and each control-plane mirror pod (what runs now).
func FromSnapshot(snap *discovery.Snapshot) []Node {
	return FromNodes(snap.Nodes)
}

// FromNodes is FromSnapshot for a list of discovered nodes (the engine's nodes of a
// stage), held nodes marked Held.
func FromNodes(nodes []discovery.Node) []Node {
	out := make([]Node, 0, len(nodes))

	for _, n := range nodes {
		node := Node{Name: n.Name, Held: n.Held, HoldReason: n.HoldReason, Kubernetes: running(n)}
		if n.Talos != nil {
			node.Talos = n.Talos.Version
		}

		out = append(out, node)
	}

	return out
}

// running is every version a node runs: its kubelet, each image of its machine config
// and each mirror pod, in component order.
func running(n discovery.Node) []Component {
	out := []Component{{Name: string(discovery.Kubelet), Version: n.KubeletVersion}}

	for _, c := range discovery.Components() {
		if n.Talos != nil {
			if image, found := n.Talos.Images[c]; found && c != discovery.Kubelet {
				out = append(out, Component{Name: string(c), Version: render.TagOf(image)})
			}
		}

		if sp, found := n.StaticPods[c]; found {
			out = append(out, Component{Name: string(c) + " pod", Version: render.TagOf(sp.Image)})
		}
	}

	return out
}
