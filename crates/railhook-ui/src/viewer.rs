//! Who is looking: the [`Viewer`] every page handler receives (`crate::session` makes it from
//! the session cookie and checks its forms) and its [`Role`]. Depends on nothing of the
//! dashboard but its error type, so the page frame can name it.

use railhook_core::ProjectId;

use crate::error::{UiError, UiResult};

/// Whose data the pages show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Signed in with a project API key: that project only.
    Project,
    /// Signed in with the operator token: any project, one at a time.
    Operator,
}

/// The signed-in person, as every page handler receives them.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    /// The project shown: the key's, or the one the operator chose.
    pub project: Option<ProjectId>,
    /// The token every form of this session carries.
    pub csrf: String,
}

impl Viewer {
    /// The project the page is about; an operator who has not chosen one is sent to the
    /// project list.
    pub fn project(&self) -> UiResult<ProjectId> {
        self.project.ok_or(UiError::Redirect("/ui/projects"))
    }
}
