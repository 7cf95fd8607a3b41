//! Concurrent calls' charges sent as one statement.
//!
//! Counting as the reference does, every counter of a call is charged whatever it holds, so
//! the charges of calls that arrive together can be made in one `rl_charge_all` without
//! changing any answer: the batch is charged as if its calls came one after another, in the
//! order they arrived, and each call is answered with the count its own hits made (its
//! counters' count before the batch, plus the hits of the calls before it, plus its own).
//! One statement and one commit for many calls leaves the database's CPU to the calls.
//!
//! A few workers (`RLS_BATCH_WORKERS`, half the cores by default, at least one) each take whatever calls
//! wait when it is free, up to the 64 items one call of the functions takes: under a light
//! load each call is its own statement, as before; under a heavy one, batches grow. Each
//! batch locks its rows in `rl_charge_all`'s one order, so batches never deadlock each
//! other. A batch the functions refuse (a count past a counter's range) is run again one
//! call at a time, so that one call's refusal is never another's.

use crate::config::{Algorithm, Unit};
use crate::metrics::Metrics;
use crate::plan::{Item, Sql, MAX_CHARGE};
use crate::store::{Failure, Store};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, Mutex};

/// The most items one statement charges (rl_charge_all takes 1 to 64).
const MOST_ITEMS: usize = 64;

struct Job {
    items: Vec<Item>,
    reply: oneshot::Sender<Result<Vec<Value>, Failure>>,
}

pub struct Batcher {
    tx: mpsc::Sender<Job>,
}

impl Batcher {
    pub fn start(store: Arc<Store>, workers: usize, metrics: Arc<Metrics>) -> Batcher {
        let (tx, rx) = mpsc::channel::<Job>(4096);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..workers.max(1) {
            tokio::spawn(work(store.clone(), rx.clone(), metrics.clone()));
        }
        Batcher { tx }
    }

    /// Charges a call's counters (at most 64, each once): each answered as rl_charge_all
    /// answers it, the count as this call's hits made it.
    /// A call waits for its batch no longer than the statement timeout, queue included.
    pub async fn charge(&self, items: Vec<Item>, deadline: std::time::Duration) -> Result<Vec<Value>, Failure> {
        let (reply, answer) = oneshot::channel();
        let wait = async {
            self.tx.send(Job { items, reply }).await.map_err(|_| Failure::Unreachable("the batcher stopped".into()))?;
            answer.await.map_err(|_| Failure::Unreachable("the batch was dropped".into()))?
        };
        match tokio::time::timeout(deadline, wait).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::Unreachable(format!(
                "rl_charge_all: no answer within the statement timeout ({} ms)",
                deadline.as_millis()
            ))),
        }
    }
}

fn same(f: &Failure) -> Failure {
    match f {
        Failure::Refused(m) => Failure::Refused(m.clone()),
        Failure::Unreachable(m) => Failure::Unreachable(m.clone()),
    }
}

async fn work(store: Arc<Store>, rx: Arc<Mutex<mpsc::Receiver<Job>>>, metrics: Arc<Metrics>) {
    let mut held: Option<Job> = None;
    loop {
        let mut jobs = Vec::new();
        {
            let mut rx = rx.lock().await;
            let first = match held.take() {
                Some(job) => job,
                None => match rx.recv().await {
                    Some(job) => job,
                    None => return,
                },
            };
            let mut n = first.items.len();
            jobs.push(first);
            while n < MOST_ITEMS {
                match rx.try_recv() {
                    // a caller gone (past its deadline, or Envoy gave up): not charged
                    Ok(job) if job.reply.is_closed() => {}
                    Ok(job) if n + job.items.len() <= MOST_ITEMS => {
                        n += job.items.len();
                        jobs.push(job);
                    }
                    Ok(job) => {
                        held = Some(job);
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        jobs.retain(|job| !job.reply.is_closed());
        metrics.charged(jobs.len());
        if !jobs.is_empty() {
            run(&store, jobs).await;
        }
    }
}

/// What identifies one counter: its key, its kind, and a budget's period.
fn counter(item: &Item) -> (String, Algorithm, Unit) {
    let unit = if item.algorithm == Algorithm::Budget { item.unit } else { Unit::Second };
    (item.key.clone(), item.algorithm, unit)
}

async fn run(store: &Store, jobs: Vec<Job>) {
    if jobs.len() == 1 {
        let job = jobs.into_iter().next().expect("one");
        let answer = charge_alone(store, &job.items).await;
        let _ = job.reply.send(answer);
        return;
    }
    // the batch's counters, each once with the hits of every call on it
    let mut merged: Vec<Item> = Vec::new();
    let mut at: HashMap<(String, Algorithm, Unit), usize> = HashMap::new();
    // for each call's item: its counter, and the hits of the calls before it on that counter
    let mut places: Vec<Vec<(usize, f64)>> = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let mut place = Vec::with_capacity(job.items.len());
        for item in &job.items {
            let id = counter(item);
            let m = match at.get(&id) {
                Some(&m) => m,
                None => {
                    at.insert(id, merged.len());
                    merged.push(Item { cost: 0.0, ..item.clone() });
                    merged.len() - 1
                }
            };
            place.push((m, merged[m].cost));
            merged[m].cost = (merged[m].cost + item.cost).min(MAX_CHARGE);
        }
        places.push(place);
    }
    let pairs: Vec<(&Item, f64)> = merged.iter().map(|i| (i, i.cost)).collect();
    let answers = match store.run(&Sql::all("rl_charge_all", &pairs)).await {
        Ok(all) => all.get("items").and_then(Value::as_array).cloned().unwrap_or_default(),
        Err(Failure::Refused(_)) => {
            // one call's hits past a counter's range: each call on its own
            for job in jobs {
                let answer = charge_alone(store, &job.items).await;
                let _ = job.reply.send(answer);
            }
            return;
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(same(&e)));
            }
            return;
        }
    };
    for (job, place) in jobs.into_iter().zip(places) {
        let mine: Vec<Value> = job
            .items
            .iter()
            .zip(place)
            .map(|(item, (m, before_me))| {
                let whole = answers.get(m).cloned().unwrap_or(Value::Null);
                as_if_alone(whole, &merged[m], before_me + item.cost)
            })
            .collect();
        let _ = job.reply.send(Ok(mine));
    }
}

async fn charge_alone(store: &Store, items: &[Item]) -> Result<Vec<Value>, Failure> {
    let pairs: Vec<(&Item, f64)> = items.iter().map(|i| (i, i.cost)).collect();
    let all = store.run(&Sql::all("rl_charge_all", &pairs)).await?;
    Ok(all.get("items").and_then(Value::as_array).cloned().unwrap_or_default())
}

/// A counter's answer to the whole batch, as it would have been right after the hits up to
/// and including this call's (`through`: the batch's hits on it so far).
fn as_if_alone(mut whole: Value, counter: &Item, through: f64) -> Value {
    let limit = f64::from(counter.requests_per_unit);
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let Some(o) = whole.as_object_mut() else { return whole };
    let later = counter.cost - through;
    if later <= 0.0 {
        return whole;
    }
    if let Some(used) = num(&Value::Object(o.clone()), "used") {
        let used = used - later;
        o.insert("used".into(), json!(used));
        o.insert("remaining".into(), json!(limit - used));
    } else if let Some(remaining) = num(&Value::Object(o.clone()), "remaining") {
        o.insert("remaining".into(), json!(remaining + later));
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(algorithm: Algorithm, cost: f64) -> Item {
        Item { key: "k".into(), algorithm, unit: Unit::Day, requests_per_unit: 10, cost }
    }

    #[test]
    fn each_call_sees_the_count_its_own_hits_made() {
        // a budget charged 3, then 4, in one batch: 12 used after both, from 5
        let whole = json!({"admitted": true, "used": 12, "limit": 10, "remaining": -2});
        let first = as_if_alone(whole.clone(), &item(Algorithm::Budget, 7.0), 3.0);
        assert_eq!((first["used"].as_f64(), first["remaining"].as_f64()), (Some(8.0), Some(2.0)));
        let second = as_if_alone(whole, &item(Algorithm::Budget, 7.0), 7.0);
        assert_eq!(second["used"].as_f64(), Some(12.0));
        // a bucket: 1 left after 2 and 5 from 8
        let whole = json!({"admitted": true, "remaining": 1, "limit": 10});
        let first = as_if_alone(whole, &item(Algorithm::Bucket, 7.0), 2.0);
        assert_eq!(first["remaining"].as_f64(), Some(6.0));
    }
}
