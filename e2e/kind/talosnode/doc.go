// Package talosnode makes the nodes of a kind cluster Talos nodes, as far as
// kubectl-ichor can tell: each node is one of the simulator's Talos machines
// (package e2e/sim/machine, the same Talos semantics as the local cluster)
// whose effects happen on the real node instead of on a simulated kubelet.
//
//   - The Talos API of every machine listens on its node's IP, port 50000,
//     in the node container's network namespace (the listener is opened
//     there; the test process serves it), so the plugin on the host and the
//     Job in a pod reach it as they reach apid on Talos. KubePrism, Talos'
//     apiserver load balancer, listens the same way on each node's
//     127.0.0.1:7445.
//
//   - A config applied with new control-plane images rewrites the image of
//     the node's static pod manifest (/etc/kubernetes/manifests): the real
//     kubelet restarts the real component on the new version's binary. A new
//     kubelet image switches /usr/bin/kubelet to that version's binary (the
//     node image carries each version's in /kind/k8s/<version>) and
//     restarts the kubelet.
//
//   - The node's /etc/os-release names Talos and the machine's version, as
//     the kubelet reports it in the Node's osImage.
//
//   - The talos Service in the default namespace points at the control
//     planes' Talos API, and talos.dev ServiceAccounts get their talosconfig
//     Secret (Talos API access from Kubernetes, enabled for ichor-system).
//
//   - The bootstrap manifests (kube-proxy, CoreDNS) are those the machines
//     render, applied as Talos applies them at bootstrap; kind installs
//     neither.
//
//   - A reboot stops the kubelet and asks every container to stop, as
//     Talos' reboot sequence does, then restarts the node's container
//     (systemd, containerd, the kubelet and every pod start again).
//
// What stays the simulator's is the Talos side: the installer, the A/B
// slots, the boot ID and the etcd members the Talos API reports (the real
// etcd runs as kubeadm's static pods).
package talosnode
