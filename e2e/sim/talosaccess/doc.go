// Package talosaccess does what Talos' kubernetesTalosAPIAccess feature does
// for the simulated machines: the serviceaccounts.talos.dev CRD and, for each
// such ServiceAccount a machine's config allows, a Secret holding a
// talosconfig for talos.default (the local cluster's and the kind e2e's).
package talosaccess
