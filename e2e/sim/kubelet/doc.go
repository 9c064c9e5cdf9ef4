// Package kubelet simulates the kubelets of a local cluster: for each
// simulated Talos machine it keeps a Node and its Lease alive, keeps the
// mirror pods of the control-plane static pods in step with the machine's
// config (with restart latencies), and runs the pods bound to the node.
//
// A pod runs in one of two ways, decided by its image alone:
//
//   - An image listed in Options.Images (repository -> local directory that
//     stands for the image's root filesystem) runs as local processes: each
//     container's command, resolved inside that directory, is started in a
//     private mount namespace where the pod's volumes (Secrets, ConfigMaps,
//     the projected ServiceAccount token, emptyDirs) are bind-mounted at their
//     mountPaths and /etc/hosts names the in-cluster services; the environment
//     carries KUBERNETES_SERVICE_HOST/PORT and the container's env. So the
//     product's Job runs unchanged: client-go's in-cluster config and Talos'
//     in-cluster talosconfig path work as in a real pod.
//   - Any other image is simulated: its containers are reported Running and
//     Ready after short latencies, and stop when the pod is deleted.
//
// Graceful deletion and eviction are honoured: the containers get SIGTERM,
// then SIGKILL after the grace period, the pod's final status is written and
// the pod is removed, as a kubelet does.
package kubelet
