// Package deploy holds no code: its test checks the deployment files at the root of the
// repository (Dockerfile, .dockerignore, compose.yaml, config.example.yaml) against the service's
// configuration, and builds the image when a container engine is available. See docs/deploy.md.
package deploy
