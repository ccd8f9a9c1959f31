//! Cursor pagination: `?limit=N&cursor=<id>` returns rows after the cursor in id order
//! (ids are time-ordered UUIDv7), and `next_cursor` is the last id when more may follow.

use serde::{Deserialize, Serialize};

use crate::error::ApiError;

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 200;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct List<T> {
    pub data: Vec<T>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub struct PageParams {
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

impl PageParams {
    pub fn limit(&self) -> Result<i64, ApiError> {
        match &self.limit {
            None => Ok(DEFAULT_LIMIT),
            Some(raw) => match raw.parse::<i64>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
                _ => Err(ApiError::bad_request("invalid_query", format!("limit must be an integer from 1 to {MAX_LIMIT}")).with_field("limit")),
            },
        }
    }

    /// The cursor as a typed id.
    pub fn cursor<T: std::str::FromStr>(&self) -> Result<Option<T>, ApiError> {
        match &self.cursor {
            None => Ok(None),
            Some(raw) => raw
                .parse::<T>()
                .map(Some)
                .map_err(|_| ApiError::bad_request("invalid_query", "cursor is not a value returned as next_cursor").with_field("cursor")),
        }
    }
}

/// Builds a page from `limit + 1` fetched rows.
pub fn page<T>(mut rows: Vec<T>, limit: i64, id: impl Fn(&T) -> String) -> List<T> {
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = if more { rows.last().map(id) } else { None };
    List { data: rows, next_cursor }
}
