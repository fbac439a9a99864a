"""Signed webhooks (Standard Webhooks): the events the main sends, their
signatures, the delivery queue's retries, and the dispatcher that turns the
audit chain and watched states into deliveries. See docs/webhooks.md."""
