// Package tools holds the small programs the kind node image is assembled
// with: mkimage (a container image tarball from local files, no Docker
// daemon or registry), pause (the sandbox image's program), podroutes (the
// node image's CNI daemon) and lb (kind's control-plane load balancer).
package tools
