// Package releases finds the releases a path goes through where the operator did not
// name them: the newest patch of a Kubernetes minor published in the registry the
// nodes' images come from, listed with go-containerregistry (the tags list API of
// the OCI distribution spec).
//
// Decisions:
//   - The repositories asked are the nodes' own, as their machine configs name them
//     (KubernetesRepositories), never registry.k8s.io by default: a cluster on a
//     private mirror gets a release its mirror serves, and one the mirror lacks is
//     refused, not found elsewhere.
//   - Every repository of the five components must carry the tag, not the
//     kube-apiserver's alone: Talos' kubelet image (ghcr.io/siderolabs/kubelet) is
//     published apart from the control-plane images and can lag behind them, and a
//     mirror may copy some images and not others. The release is the newest patch
//     every repository has; five tag lists cost five requests, as many as checking the
//     other four at one tag would.
//   - Only strict vX.Y.Z tags count: -rc, -alpha and digest tags are not releases.
//   - Credentials are the operator's (the docker keychain: ~/.docker/config.json and
//     its credential helpers) unless Options says otherwise; each listing is bounded
//     by Timeout.
package releases
