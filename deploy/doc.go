// Package deploy holds qpdrain's Kubernetes manifests and Prometheus rules.
// It is a module of its own so that its test's dependencies (the
// Kubernetes API's types) stay out of qpdrain's: the test decodes the
// manifests strictly into those types, an offline schema check that needs
// no cluster and no schema download (make deploy-check).
package deploy
