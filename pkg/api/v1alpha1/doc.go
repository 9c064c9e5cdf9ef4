// Package v1alpha1 holds the versioned documents kubectl-ichor prints for automation
// (`-o json|yaml`): the Plan of one upgrade, the UpgradePath of several, and the
// Operation, the state of one upgrade launched in the cluster (`kubectl ichor status`;
// the state ConfigMap holds it). Fields are only ever added within a version; a change
// of meaning gets a new version.
package v1alpha1
