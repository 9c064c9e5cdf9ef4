// Package render owns a stage's machine configuration: from a node's active
// Talos machine config (possibly several documents: v1alpha1, HostnameConfig,
// ...) and the version each Kubernetes component should run, it produces the
// config to apply, with nothing changed but image tags.
//
// The five images are cluster.apiServer.image, cluster.controllerManager.image,
// cluster.scheduler.image, cluster.proxy.image and machine.kubelet.image; in
// Talos 1.13 only the v1alpha1 document holds them. Render patches that
// document through machinery's typed PatchV1Alpha1, so every other document
// is carried over as it was, and checks the encoded result against the node's
// config with Verify before returning it.
//
// The package holds no stage policy: pkg/stages decides which component gets
// which version in each stage (such as the apiserver at the target and the
// rest pinned to the node's kubelet version) and passes a Versions map.
//
// Decisions:
//   - An image keeps its repository exactly as written, so a private mirror
//     path (registry.example.com:5000/mirror/kube-apiserver) survives.
//   - A digest is dropped when the tag changes, and Change.DroppedDigest says
//     so: a runtime pulls by digest alone, so keeping it would keep the old
//     image under the new tag, and ichor cannot know the new digest. An image
//     already on the wanted tag keeps its digest.
//   - A version is written as a tag with one leading "v" ("1.36.3" and
//     "v1.36.3" both give "v1.36.3"); "vv1.36.3" is refused.
//   - The rendered bytes carry no comments; Hash ignores comments and
//     formatting, so a node that runs a render hashes equal to it.
//   - A worker carries only the kubelet image; a control plane with
//     kube-proxy disabled carries no proxy image. Such components are
//     skipped and reported, not refused.
package render
