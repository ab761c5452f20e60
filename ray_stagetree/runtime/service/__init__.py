"""The plan service: a named, detached actor hosting one search plan shared
by the studies that attach to it, and the client a driver attaches with.
Builds on the controller side."""
