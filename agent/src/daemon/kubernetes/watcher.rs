//! The pods of this node, kept current in the background: a dedicated thread lists them,
//! then watches from the list's resource version (bookmarks on), resumes each watch where
//! the last one ended, lists again on 410 Gone, and backs off exponentially on failures.
//! Blocking ureq stays off the daemon's async runtime; the daemon polls
//! [`PodWatcher::generation`] (cheap) and reads [`PodWatcher::current`] when it moved.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::KubeError;
use super::client::KubeClient;
use super::config::KubeConfig;
use super::pods::{Applied, Pod, PodStore};

/// A watch that ends this soon without an event counts as a failure (backoff), so a
/// server that closes every watch at once is not hammered.
const MIN_HEALTHY_WATCH: Duration = Duration::from_secs(1);

/// Handle to the watcher thread. Dropping it stops the thread: at once when it is pausing,
/// else after the current request (a watch lasts at most `watch_timeout`).
#[derive(Debug)]
pub struct PodWatcher {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    stop: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    pods: Vec<Pod>,
    generation: u64,
    synced: bool,
    last_error: Option<String>,
}

impl PodWatcher {
    /// Checks the configuration (CA file) and starts the thread.
    pub fn spawn(config: KubeConfig) -> Result<PodWatcher, KubeError> {
        let client = KubeClient::new(&config)?;
        let shared = Arc::new(Shared::default());
        let thread_shared = Arc::clone(&shared);
        thread::Builder::new()
            .name("lookback-kube".to_owned())
            .spawn(move || run(&client, &config, &thread_shared))
            .map_err(|source| KubeError::Spawn { source })?;
        Ok(PodWatcher { shared })
    }

    /// The pods of this node as last seen, by uid.
    pub fn current(&self) -> Vec<Pod> {
        self.shared.lock().pods.clone()
    }

    /// Increases whenever a pod appears, goes, or changes its namespace, name, labels or
    /// containers (what selectors see); compare with the last value seen.
    pub fn generation(&self) -> u64 {
        self.shared.lock().generation
    }

    /// Whether a list has succeeded (for `/readyz`: before that, no pod matches).
    pub fn is_synced(&self) -> bool {
        self.shared.lock().synced
    }

    /// The last failure (`{:#}`-style chain), cleared by the next successful list or event.
    pub fn last_error(&self) -> Option<String> {
        self.shared.lock().last_error.clone()
    }

    /// Blocks until the generation differs from `seen` or `timeout` passes; returns the
    /// generation then. For a blocking caller (tests, `spawn_blocking`).
    pub fn wait_for_change(&self, seen: u64, timeout: Duration) -> u64 {
        let state = self.shared.lock();
        let (state, _) = self
            .shared
            .changed
            .wait_timeout_while(state, timeout, |s| s.generation == seen)
            .unwrap_or_else(PoisonError::into_inner);
        state.generation
    }
}

impl Drop for PodWatcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Makes the store's pods current; the generation moves only when something a selector
    /// looks at changed (not for every status update or new resource version).
    fn publish(&self, store: &PodStore) {
        let pods = store.pods();
        let mut state = self.lock();
        state.synced = true;
        state.last_error = None;
        let relevant = |p: &Pod| {
            (
                p.uid.clone(),
                p.namespace.clone(),
                p.name.clone(),
                p.labels.clone(),
                p.containers.clone(),
            )
        };
        let moved = !state
            .pods
            .iter()
            .map(relevant)
            .eq(pods.iter().map(relevant));
        state.pods = pods;
        if moved {
            state.generation += 1;
            self.changed.notify_all();
        }
    }

    fn fail(&self, error: &KubeError) {
        let text = crate::sys::error_chain(error);
        log::warn!("kubernetes: {text}");
        self.lock().last_error = Some(text);
    }

    /// Sleeps `pause`, waking early on stop; returns whether to stop.
    fn sleep(&self, pause: Duration) -> bool {
        let state = self.lock();
        let _unused = self
            .changed
            .wait_timeout_while(state, pause, |_| !self.stopped())
            .unwrap_or_else(PoisonError::into_inner);
        self.stopped()
    }
}

/// Exponential backoff between `min` and `max`.
#[derive(Debug)]
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &KubeConfig) -> Backoff {
        Backoff {
            min: config.min_backoff,
            max: config.max_backoff.max(config.min_backoff),
            next: config.min_backoff,
        }
    }

    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

/// How one watch request ended.
enum WatchEnd {
    /// The server closed it; resume from the store's resource version.
    Closed {
        healthy: bool,
    },
    /// 410 Gone: list again.
    Relist,
    /// A failure: pause, then watch again.
    Failed,
    Stop,
}

fn run(client: &KubeClient, config: &KubeConfig, shared: &Shared) {
    let mut store = PodStore::new(&config.node_name);
    let mut backoff = Backoff::new(config);
    'list: while !shared.stopped() {
        match client.list_pods(&config.node_name) {
            Ok(list) => {
                store.replace(list);
                shared.publish(&store);
            }
            Err(error) => {
                shared.fail(&error);
                if shared.sleep(backoff.next()) {
                    return;
                }
                continue;
            }
        }
        loop {
            match watch_once(client, config, shared, &mut store) {
                WatchEnd::Closed { healthy: true } => backoff.reset(),
                WatchEnd::Closed { healthy: false } | WatchEnd::Failed => {
                    if shared.sleep(backoff.next()) {
                        return;
                    }
                }
                // Paused too: a server answering every watch with 410 must not be
                // listed in a tight loop.
                WatchEnd::Relist => {
                    if shared.sleep(backoff.next()) {
                        return;
                    }
                    continue 'list;
                }
                WatchEnd::Stop => return,
            }
        }
    }
}

fn watch_once(
    client: &KubeClient,
    config: &KubeConfig,
    shared: &Shared,
    store: &mut PodStore,
) -> WatchEnd {
    let started = Instant::now();
    let stream = match client.watch_pods(&config.node_name, store.resource_version()) {
        Ok(stream) => stream,
        Err(KubeError::Gone { .. }) => return WatchEnd::Relist,
        Err(error) => {
            shared.fail(&error);
            return WatchEnd::Failed;
        }
    };
    let mut events = 0_u64;
    for event in stream {
        if shared.stopped() {
            return WatchEnd::Stop;
        }
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                shared.fail(&error);
                return WatchEnd::Failed;
            }
        };
        events += 1;
        match store.apply(event) {
            Applied::Changed => shared.publish(store),
            Applied::Unchanged => {}
            Applied::Gone => return WatchEnd::Relist,
            Applied::Failed(status) => {
                shared.fail(&KubeError::WatchStatus {
                    code: status.code,
                    reason: status.reason,
                    message: status.message,
                });
                return WatchEnd::Failed;
            }
        }
    }
    if shared.stopped() {
        return WatchEnd::Stop;
    }
    WatchEnd::Closed {
        healthy: events > 0 || started.elapsed() >= MIN_HEALTHY_WATCH,
    }
}
